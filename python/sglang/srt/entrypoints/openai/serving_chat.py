"""POST /v1/chat/completions: chat template -> prompt ids -> TokenizerManager."""

from __future__ import annotations

import logging
import os
from typing import Any, AsyncIterator, Optional

from fastapi.responses import JSONResponse, StreamingResponse

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
    random_id,
)
from sglang.srt.entrypoints.openai.utils import (
    SSE_DONE,
    OpenAIError,
    check_logprobs_num,
    check_model_name,
    error_body,
    finish_reason_of,
    from_error,
    make_usage,
    parse_model,
    sse,
)
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import GenerateCall, TokenizerManager

logger = logging.getLogger(__name__)


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
                    TopLogprob(token=t or "", logprob=v, bytes=list((t or "").encode("utf-8"))) for v, _, t in tops or []
                ],
            )
        )
    return ChoiceLogprobs(content=content)


def message_dicts(req: ChatCompletionRequest) -> list[dict]:
    """Messages as plain dicts for the chat template (text content parts are joined)."""
    out = []
    for m in req.messages:
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise OpenAIError(f"content parts of type {part.type!r} are not supported", param="messages")
                texts.append(part.text)
            content = "".join(texts)
        d = {"role": m.role, "content": content or ""}
        if m.name:
            d["name"] = m.name
        out.append(d)
    return out


class OpenAIServingChat:
    def __init__(self, tokenizer_manager: TokenizerManager):
        self.tm = tokenizer_manager
        self.server_args = tokenizer_manager.server_args
        self.chat_template = self._load_chat_template(self.server_args.chat_template)

    @staticmethod
    def _load_chat_template(value: Optional[str]) -> Optional[str]:
        if value and os.path.isfile(value):
            with open(value, encoding="utf-8") as f:
                return f.read()
        return value

    def _prompt_ids(self, req: ChatCompletionRequest) -> list[int]:
        if self.tm.tokenizer is None:
            raise OpenAIError("chat completions need a tokenizer (server started with --skip-tokenizer-init)")
        from sglang.srt.utils.hf_transformers_utils import apply_chat_template

        messages = message_dicts(req)
        try:
            prompt = apply_chat_template(
                self.tm.tokenizer,
                messages,
                add_generation_prompt=True,
                chat_template=self.chat_template,
                **(req.chat_template_kwargs or {}),
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
        if req.tools:
            raise OpenAIError("tools are not supported by this server", param="tools")
        if req.response_format is not None and req.response_format.type != "text":
            raise OpenAIError(f"response_format {req.response_format.type!r} is not supported", param="response_format")
        max_new = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        return GenerateReqInput(
            input_ids=self._prompt_ids(req),
            sampling_params=req.base_sampling_params(max_new),
            rid=req.rid,
            stream=req.stream,
            return_logprob=req.logprobs,
            top_logprobs_num=req.top_logprobs or 0,
            return_text_in_logprobs=True,
        )

    async def handle(self, body: Any, raw_request: Any = None):
        try:
            req = parse_model(ChatCompletionRequest, body)
            obj = self._build(req)
            call = await self.tm.submit(obj)
        except OpenAIError as err:
            return from_error(err)
        except ValueError as err:
            return from_error(OpenAIError(str(err)))
        if req.stream:
            return StreamingResponse(self._stream(req, call, raw_request), media_type="text/event-stream")
        return await self._complete(req, call, raw_request)

    async def _complete(self, req: ChatCompletionRequest, call: GenerateCall, raw_request: Any):
        outs: dict[int, dict] = {}
        async for chunk in self.tm.iter_chunks(call, raw_request):
            outs[chunk.index] = chunk.out
        if len(outs) < len(call.states):
            return JSONResponse(error_body("client disconnected", 499, "ClientDisconnected"), status_code=499)
        ordered = [outs[i] for i in range(len(call.states))]
        choices = []
        for i, out in enumerate(ordered):
            meta = out["meta_info"]
            reason, matched = finish_reason_of(meta["finish_reason"])
            logprobs = chat_logprobs(meta["output_token_logprobs"], meta["output_top_logprobs"]) if req.logprobs else None
            choices.append(
                ChatCompletionChoice(
                    index=i,
                    message=ChatResponseMessage(content=out["text"]),
                    logprobs=logprobs,
                    finish_reason=reason,
                    matched_stop=matched,
                )
            )
        resp = ChatCompletionResponse(
            id=random_id("chatcmpl"), model=self.server_args.served_model_name, choices=choices, usage=make_usage(ordered, req.n)
        )
        return JSONResponse(resp.model_dump(exclude_none=True))

    async def _stream(self, req: ChatCompletionRequest, call: GenerateCall, raw_request: Any) -> AsyncIterator[str]:
        rid = random_id("chatcmpl")
        model = self.server_args.served_model_name
        started: set[int] = set()
        finals: dict[int, dict] = {}

        def chunk_of(choice: ChatCompletionStreamChoice) -> str:
            return sse(ChatCompletionStreamResponse(id=rid, model=model, choices=[choice]))

        try:
            async for chunk in self.tm.iter_chunks(call, raw_request):
                i = chunk.index
                if i not in started:
                    started.add(i)
                    yield chunk_of(ChatCompletionStreamChoice(index=i, delta=DeltaMessage(role="assistant", content="")))
                meta = chunk.out["meta_info"]
                logprobs = None
                if req.logprobs:
                    start = chunk.logprob_start
                    logprobs = chat_logprobs(meta["output_token_logprobs"][start:], meta["output_top_logprobs"][start:])
                    if not logprobs.content:
                        logprobs = None
                if chunk.delta_text or logprobs is not None:
                    yield chunk_of(
                        ChatCompletionStreamChoice(index=i, delta=DeltaMessage(content=chunk.delta_text), logprobs=logprobs)
                    )
                if chunk.finished:
                    finals[i] = chunk.out
                    reason, matched = finish_reason_of(meta["finish_reason"])
                    yield chunk_of(
                        ChatCompletionStreamChoice(index=i, delta=DeltaMessage(), finish_reason=reason, matched_stop=matched)
                    )
            if req.stream_options and req.stream_options.include_usage and len(finals) == len(call.states):
                ordered = [finals[i] for i in range(len(call.states))]
                yield sse(ChatCompletionStreamResponse(id=rid, model=model, choices=[], usage=make_usage(ordered, req.n)))
        except Exception as err:  # noqa: BLE001 - report in-band, the stream has started
            logger.exception("chat stream failed")
            yield sse(error_body(str(err), 500, "InternalServerError"))
        yield SSE_DONE
