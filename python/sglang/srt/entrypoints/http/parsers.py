"""/parse_function_call and /separate_reasoning, in upstream SGLang's shapes:

    POST /parse_function_call  {"text": str, "tools": [tool], "tool_call_parser": str (optional)}
                            -> {"normal_text": str, "calls": [{"tool_index", "name", "parameters"}]}
    POST /separate_reasoning   {"text": str, "reasoning_parser": str (optional)}
                            -> {"text": str, "reasoning_text": str}

A parser left out is the server's (`--tool-call-parser` / `--reasoning-parser`); neither: 400."""

from __future__ import annotations

from typing import Any, Callable, Optional

from fastapi import APIRouter, Request
from pydantic import BaseModel

from sglang.srt.entrypoints.http.common import read_json
from sglang.srt.entrypoints.openai.chat_tools import check_tools
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.utils import OpenAIError, parse_model
from sglang.srt.function_call import make_detector
from sglang.srt.reasoning_parser import reasoning_detector_class
from sglang.srt.server_args import ServerArgs


class ParseFunctionCallRequest(BaseModel):
    text: str
    tools: list[dict[str, Any]]
    tool_call_parser: Optional[str] = None


class SeparateReasoningRequest(BaseModel):
    text: str
    reasoning_parser: Optional[str] = None


def _parser(
    factory: Callable[[str], Any], value: Optional[str], default: Optional[str], flag: str, param: str
):
    """The parser the request names, else the server's; 400 naming `param` when neither or unknown."""
    name = value or default
    if name is None:
        raise OpenAIError(f"give `{param}`: this server was started without {flag}", param=param)
    try:
        return factory(name)
    except ValueError as err:
        raise OpenAIError(str(err), param=param) from None


class ParserRoutes:
    """The parsers of /v1/chat/completions on their own (`router()`)."""

    def __init__(self, server_args: ServerArgs):
        self.args = server_args

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/parse_function_call", self.parse_function_call, methods=["POST"])
        router.add_api_route("/separate_reasoning", self.separate_reasoning, methods=["POST"])
        return router

    async def parse_function_call(self, request: Request) -> dict:
        req = parse_model(ParseFunctionCallRequest, await read_json(request))
        # the tools are checked as /v1/chat/completions checks them (400 naming "tools")
        check_tools(ChatCompletionRequest(messages=[], tools=req.tools))
        detector = _parser(
            make_detector,
            req.tool_call_parser,
            self.args.tool_call_parser,
            "--tool-call-parser",
            "tool_call_parser",
        )
        result = detector.detect_and_parse(req.text, req.tools)
        return {"normal_text": result.normal_text, "calls": [call.model_dump() for call in result.calls]}

    async def separate_reasoning(self, request: Request) -> dict:
        req = parse_model(SeparateReasoningRequest, await read_json(request))
        cls = _parser(
            reasoning_detector_class,
            req.reasoning_parser,
            self.args.reasoning_parser,
            "--reasoning-parser",
            "reasoning_parser",
        )
        result = cls().detect_and_parse(req.text)
        return {"text": result.normal_text, "reasoning_text": result.reasoning_text}
