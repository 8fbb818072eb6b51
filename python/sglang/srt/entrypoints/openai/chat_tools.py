"""The tool-calling fields of /v1/chat/completions: `tools`, `tool_choice`, `parallel_tool_calls`.

`check_tools` refuses malformed input with a 400 naming the field; `tool_mode` says what the
request asks for ("none": no tools in the prompt, the output is content; "auto": the model may
call, `--tool-call-parser` finds the calls; "forced": `tool_choice` `required` or a named function,
enforced by a JSON-schema constraint and parsed as the JSON array of calls it allows).
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.utils import OpenAIError
from sglang.srt.function_call.constraint import tool_call_json_schema

TOOL_CHOICES = ("none", "auto", "required")
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
ToolMode = Literal["none", "auto", "forced"]


def _tool_names(tools: list[Any]) -> list[str]:
    """The tools' function names; 400 (param "tools") on a malformed tool."""
    names: list[str] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise OpenAIError(
                f'{where}: a tool must be {{"type": "function", "function": {{...}}}}', param="tools"
            )
        function = tool.get("function")
        if not isinstance(function, dict):
            raise OpenAIError(f"{where}.function must be an object", param="tools")
        name = function.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
            raise OpenAIError(
                f"{where}.function.name must be 1 to 64 letters, digits, '_', '-' or '.', got {name!r}",
                param="tools",
            )
        if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
            raise OpenAIError(f"{where}.function.parameters must be a JSON schema object", param="tools")
        if name in names:
            raise OpenAIError(f"{where}: function {name!r} is declared twice", param="tools")
        names.append(name)
    return names


def check_tools(req: ChatCompletionRequest) -> None:
    """400 naming the field: a malformed tool, an unknown `tool_choice`, a named function that is
    not among the tools, `required` without tools, or upstream's message-level tools."""
    if any(getattr(m, "tools", None) for m in req.messages):  # upstream's message-level tools
        raise OpenAIError("tools (in a system / developer message) are not supported", param="messages")
    names = _tool_names(req.tools or [])
    choice = req.tool_choice
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise OpenAIError(
                f"tool_choice must be one of {list(TOOL_CHOICES)} or a named function, got {choice!r}",
                param="tool_choice",
            )
        if choice == "required" and not names:
            raise OpenAIError(
                "tool_choice 'required' needs `tools`, and none were given", param="tool_choice"
            )
        return
    function = choice.get("function") if choice.get("type", "function") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise OpenAIError(
            'a named tool_choice must be {"type": "function", "function": {"name": ...}}', param="tool_choice"
        )
    if name not in names:
        raise OpenAIError(
            f"tool_choice names function {name!r}, which is not among the tools {names}", param="tool_choice"
        )


def tool_mode(req: ChatCompletionRequest) -> ToolMode:
    if not req.tools or req.tool_choice == "none":
        return "none"
    if req.tool_choice is None or req.tool_choice == "auto":
        return "auto"
    return "forced"


def template_tools(req: ChatCompletionRequest) -> Optional[list[dict[str, Any]]]:
    """The tools the chat template renders (HF's `tools=`, OpenAI's tool dicts); none for "none"."""
    if tool_mode(req) == "none":
        return None
    return [{"type": "function", **tool} for tool in req.tools or []]


def tool_sampling_params(req: ChatCompletionRequest) -> dict[str, Any]:
    """`json_schema` (upstream's sampling param) allowing only the calls a forced `tool_choice` asks for."""
    if tool_mode(req) != "forced":
        return {}
    return {"json_schema": tool_call_json_schema(req.tools or [], req.tool_choice, req.parallel_tool_calls)}
