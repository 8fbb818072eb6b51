"""POST /v1/chat/completions: chat template (with the request's tools) -> prompt ids ->
TokenizerManager; the output's reasoning and tool calls split off by `chat_output`."""

from __future__ import annotations

import json
from typing import Any, Optional

from pydantic import BaseModel

from sglang.srt.entrypoints.openai.chat_output import ChatOutputParsers, ChoiceOutput, OutputParsing
from sglang.srt.entrypoints.openai.chat_templates import named_tokenizer_template, resolve_chat_template
from sglang.srt.entrypoints.openai.chat_tools import check_tools, template_tools, tool_sampling_params
from sglang.srt.entrypoints.openai.protocol import (
    MAX_LOGPROBS,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatResponseMessage,
    ChoiceLogprobs,
    DeltaMessage,
    TokenLogprob,
    TopLogprob,
)
from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase, finish_fields, logprob_entries
from sglang.srt.entrypoints.openai.utils import OpenAIError, check_logprobs_num, check_model_name
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang.srt.managers.tokenizer.tokenizer_state import ReqChunk


def chat_logprobs(token_lps: list, top_lps: list) -> ChoiceLogprobs:
    """SGLang (logprob, id, text) entries -> OpenAI chat logprobs."""
    content = []
    for i, (lp, _tid, text) in enumerate(token_lps):
        text = text or ""
        tops = top_lps[i] if i < len(top_lps) else []
        content.append(
            TokenLogprob(
                token=text,
                logprob=lp,
                bytes=list(text.encode("utf-8")),
                top_logprobs=[
                    TopLogprob(token=t or "", logprob=v, bytes=list((t or "").encode("utf-8")))
                    for v, _, t in tops or []
                ],
            )
        )
    return ChoiceLogprobs(content=content)


def message_dicts(req: ChatCompletionRequest) -> list[dict]:
    """Messages as plain dicts for the chat template (text content parts are joined). A tool-using
    history reaches the template as HF templates take it: an assistant's `tool_calls` (each call's
    JSON `arguments` string parsed to a dict), a tool message's `tool_call_id`, `name` and an
    assistant's `reasoning_content`."""
    out = []
    for m in req.messages:
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise OpenAIError(
                        f"content parts of type {part.type!r} are not supported", param="messages"
                    )
                texts.append(part.text)
            content = "".join(texts)
        d: dict[str, Any] = {"role": m.role, "content": content or ""}
        if m.name:
            d["name"] = m.name
        if m.tool_calls:
            d["tool_calls"] = [_template_tool_call(call) for call in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.reasoning_content is not None:
            d["reasoning_content"] = m.reasoning_content
        out.append(d)
    return out


def _template_tool_call(call: dict) -> dict:
    """An OpenAI tool call with its `function.arguments` as a dict (what HF templates iterate)."""
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError:
        raise OpenAIError(
            f"tool call arguments must be a JSON object, got {function['arguments']!r}", param="messages"
        ) from None
    return {**call, "function": {**function, "arguments": arguments}}


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    """`chat_template_kwargs`, plus upstream's thinking switches when `reasoning_effort` /
    `reasoning` ask (`thinking` for DeepSeek / Kimi templates, `enable_thinking` for Qwen3 / GLM);
    the request's own kwargs win."""
    kwargs = dict(req.chat_template_kwargs or {})
    thinking = req.thinking()
    if thinking is not None:
        kwargs.setdefault("thinking", thinking)
        kwargs.setdefault("enable_thinking", thinking)
    return kwargs


def template_flags(req: ChatCompletionRequest) -> dict[str, bool]:
    """`continue_final_message`: the last message, an assistant's, stays open (no end of turn, no
    generation prompt) so that the model continues it; otherwise a generation prompt is added."""
    if not req.continue_final_message:
        return {"add_generation_prompt": True}
    if req.messages[-1].role != "assistant":
        raise OpenAIError(
            "continue_final_message needs the last message to be the assistant's",
            param="continue_final_message",
        )
    return {"add_generation_prompt": False, "continue_final_message": True}


class OpenAIServingChat(OpenAIServingBase):
    request_cls = ChatCompletionRequest
    response_cls = ChatCompletionResponse
    stream_response_cls = ChatCompletionStreamResponse
    id_prefix = "chatcmpl"

    def __init__(self, tokenizer_manager: TokenizerManager):
        super().__init__(tokenizer_manager)
        self.chat_template = self._load_chat_template(
            self.server_args.chat_template, self.server_args.hf_chat_template_name, self.tm.tokenizer
        )

    @staticmethod
    def _load_chat_template(value: Optional[str], hf_name: Optional[str], tokenizer: Any) -> Optional[str]:
        """`--chat-template` (a built-in name, a file or Jinja text), else `--hf-chat-template-name`
        (one of the tokenizer's named templates), else None: the tokenizer's own."""
        if value is not None:
            return resolve_chat_template(value)
        if hf_name is not None and tokenizer is not None:
            return named_tokenizer_template(tokenizer, hf_name)
        return None

    def _prompt_ids(self, req: ChatCompletionRequest) -> list[int]:
        if self.tm.tokenizer is None:
            raise OpenAIError("chat completions need a tokenizer (server started with --skip-tokenizer-init)")
        from sglang.srt.utils.hf_transformers_utils import apply_chat_template

        messages = message_dicts(req)
        tools = template_tools(req)
        try:
            prompt = apply_chat_template(
                self.tm.tokenizer,
                messages,
                chat_template=self.chat_template,
                **({"tools": tools} if tools is not None else {}),
                **template_flags(req),
                **template_kwargs(req),
            )
        except ValueError:
            raise
        except Exception as err:  # noqa: BLE001 - template errors are the caller's input
            raise OpenAIError(f"failed to apply the chat template: {err}") from None
        if isinstance(prompt, str):
            ids = self.tm.tokenizer.encode(prompt, add_special_tokens=False)
            return list(getattr(ids, "ids", ids))
        return list(prompt)

    def _build(self, req: ChatCompletionRequest) -> GenerateReqInput:
        check_model_name(req.model, self.server_args.served_model_name, self.server_args.model_path)
        if not req.messages:
            raise OpenAIError("messages must not be empty", param="messages")
        if req.top_logprobs is not None and not req.logprobs:
            raise OpenAIError("top_logprobs requires logprobs to be true", param="top_logprobs")
        check_logprobs_num(req.top_logprobs, "top_logprobs", MAX_LOGPROBS)
        check_tools(req)
        max_new = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        params = {**self.default_sampling, **req.base_sampling_params(max_new), **tool_sampling_params(req)}
        req._parsers = ChatOutputParsers(self._output_parsing(req))
        params.setdefault("max_new_tokens", None)  # no max_tokens: to EOS or the context limit (upstream)
        return GenerateReqInput(
            input_ids=req.input_ids or self._prompt_ids(req),  # upstream: given ids skip the template
            sampling_params=params,
            rid=req.rid,
            stream=req.stream,
            return_logprob=req.logprobs,
            top_logprobs_num=req.top_logprobs or 0,
            return_text_in_logprobs=True,
            **req.bootstrap_fields(),  # PD disaggregation
        )

    def _output_parsing(self, req: ChatCompletionRequest) -> OutputParsing:
        return OutputParsing.of(
            req,
            getattr(self.server_args, "reasoning_parser", None),
            getattr(self.server_args, "tool_call_parser", None),
            template_kwargs(req),
        )

    def _choice(self, req: ChatCompletionRequest, index: int, out: dict) -> BaseModel:
        logprobs = chat_logprobs(*logprob_entries(out)) if req.logprobs else None
        parsing = req._parsers.parsing if req._parsers is not None else self._output_parsing(req)
        if parsing.active:
            output = ChoiceOutput(parsing)
            message = output.message(out["text"])
            finish = _call_finish(finish_fields(out), output.made_calls)
        else:
            message, finish = ChatResponseMessage(content=out["text"]), finish_fields(out)
        return ChatCompletionChoice(index=index, message=message, logprobs=logprobs, **finish)

    def _stream_choices(self, req: ChatCompletionRequest, chunk: ReqChunk, first: bool) -> list[BaseModel]:
        """Role first, then the text (reasoning / content, with logprobs) when there is any, each
        tool-call piece, what the parsers held back, then a separate finish choice."""
        i = chunk.index
        choices: list[BaseModel] = []
        if first:
            choices.append(
                ChatCompletionStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
            )
        logprobs = chat_logprobs(*logprob_entries(chunk.out, chunk.logprob_start)) if req.logprobs else None
        if logprobs is not None and not logprobs.content:
            logprobs = None
        output = req._parsers[i] if req._parsers is not None and req._parsers.parsing.active else None
        if output is None:
            text, calls = DeltaMessage(content=chunk.delta_text), []
        else:
            text, calls = output.deltas(chunk.delta_text)
            if chunk.finished:
                rest = output.finish()
                text.content = ((text.content or "") + (rest.content or "")) or None
                text.reasoning_content = (
                    (text.reasoning_content or "") + (rest.reasoning_content or "")
                ) or None
        if text.content or text.reasoning_content or logprobs is not None:
            choices.append(ChatCompletionStreamChoice(index=i, delta=text, logprobs=logprobs))
        choices += [ChatCompletionStreamChoice(index=i, delta=call) for call in calls]
        if chunk.finished:
            finish = _call_finish(finish_fields(chunk.out), output is not None and output.made_calls)
            choices.append(ChatCompletionStreamChoice(index=i, delta=DeltaMessage(), **finish))
        return choices


def _call_finish(fields: dict[str, Any], made_calls: bool) -> dict[str, Any]:
    """`finish_reason` "tool_calls" when the output ended (stopped) with calls, as OpenAI's."""
    if made_calls and fields["finish_reason"] == "stop":
        return {"finish_reason": "tool_calls", "matched_stop": None}
    return fields
