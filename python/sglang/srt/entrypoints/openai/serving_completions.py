"""POST /v1/completions on top of the TokenizerManager."""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator

from fastapi.responses import JSONResponse, StreamingResponse

from sglang.srt.entrypoints.openai.protocol import (
    MAX_LOGPROBS,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
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


def completion_logprobs(token_lps: list, top_lps: list, text_offset: int) -> CompletionLogprobs:
    """SGLang (logprob, id, text) entries -> OpenAI legacy completion logprobs."""
    out = CompletionLogprobs()
    offset = text_offset
    for i, (lp, _tid, text) in enumerate(token_lps):
        text = text or ""
        out.tokens.append(text)
        out.token_logprobs.append(lp)
        top = top_lps[i] if i < len(top_lps) else None
        out.top_logprobs.append(_top_dict(top) if top else None)
        out.text_offset.append(offset)
        offset += len(text)
    return out


def _top_dict(top: list) -> dict[str, float]:
    """{token text: logprob}; when two tokens share a text (e.g. partial UTF-8 bytes) keep the likelier."""
    out: dict[str, float] = {}
    for lp, _tid, text in top:
        out.setdefault(text or "", lp)
    return out


class OpenAIServingCompletion:
    def __init__(self, tokenizer_manager: TokenizerManager):
        self.tm = tokenizer_manager
        self.server_args = tokenizer_manager.server_args

    def _build(self, req: CompletionRequest) -> GenerateReqInput:
        check_model_name(req.model, self.server_args.served_model_name, self.server_args.model_path)
        check_logprobs_num(req.logprobs, "logprobs", MAX_LOGPROBS)
        if req.suffix:
            raise OpenAIError("suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise OpenAIError("best_of is not supported (use n)", param="best_of")
        if req.echo and req.logprobs is not None:
            raise OpenAIError("echo together with logprobs is not supported", param="echo")
        prompt = req.prompt
        if isinstance(prompt, list) and not prompt:
            raise OpenAIError("prompt must not be empty", param="prompt")
        text: Any = None
        input_ids: Any = None
        if isinstance(prompt, str) or (isinstance(prompt, list) and isinstance(prompt[0], str)):
            text = prompt
        else:
            input_ids = prompt
        return GenerateReqInput(
            text=text,
            input_ids=input_ids,
            sampling_params=req.base_sampling_params(req.max_tokens),
            rid=req.rid,
            stream=req.stream,
            return_logprob=req.logprobs is not None,
            top_logprobs_num=req.logprobs or 0,
            return_text_in_logprobs=True,
        )

    def _echo_text(self, req: CompletionRequest, index: int) -> str:
        if not req.echo:
            return ""
        prompt = req.prompt
        i = index // max(req.n, 1)
        if isinstance(prompt, str):
            return prompt
        item = prompt[i]
        if isinstance(item, str):
            return item
        ids = item if isinstance(item, list) else prompt
        return self.tm.tokenizer.decode(ids) if self.tm.tokenizer is not None else ""

    async def handle(self, body: Any, raw_request: Any = None):
        try:
            req = parse_model(CompletionRequest, body)
            obj = self._build(req)
            call = await self.tm.submit(obj)
        except OpenAIError as err:
            return from_error(err)
        except ValueError as err:
            return from_error(OpenAIError(str(err)))
        if req.stream:
            return StreamingResponse(self._stream(req, call, raw_request), media_type="text/event-stream")
        return await self._complete(req, call, raw_request)

    async def _complete(self, req: CompletionRequest, call: GenerateCall, raw_request: Any):
        outs: dict[int, dict] = {}
        async for chunk in self.tm.iter_chunks(call, raw_request):
            outs[chunk.index] = chunk.out
        if len(outs) < len(call.states):
            return JSONResponse(error_body("client disconnected", 499, "ClientDisconnected"), status_code=499)
        ordered = [outs[i] for i in range(len(call.states))]
        choices = []
        for i, out in enumerate(ordered):
            reason, matched = finish_reason_of(out["meta_info"]["finish_reason"])
            echo = self._echo_text(req, i)
            logprobs = None
            if req.logprobs is not None:
                meta = out["meta_info"]
                logprobs = completion_logprobs(meta["output_token_logprobs"], meta["output_top_logprobs"], len(echo))
            choices.append(
                CompletionChoice(index=i, text=echo + out["text"], logprobs=logprobs, finish_reason=reason, matched_stop=matched)
            )
        resp = CompletionResponse(
            id=random_id("cmpl"),
            model=self.server_args.served_model_name,
            choices=choices,
            usage=make_usage(ordered, req.n),
        )
        return JSONResponse(resp.model_dump(exclude_none=True))

    async def _stream(self, req: CompletionRequest, call: GenerateCall, raw_request: Any) -> AsyncIterator[str]:
        rid = random_id("cmpl")
        model = self.server_args.served_model_name
        finals: dict[int, dict] = {}
        offsets: dict[int, int] = {}
        try:
            async for chunk in self.tm.iter_chunks(call, raw_request):
                text = chunk.delta_text
                if chunk.index not in offsets:
                    text = self._echo_text(req, chunk.index) + text
                    offsets[chunk.index] = 0
                logprobs = None
                if req.logprobs is not None:
                    meta = chunk.out["meta_info"]
                    start = chunk.logprob_start
                    logprobs = completion_logprobs(
                        meta["output_token_logprobs"][start:], meta["output_top_logprobs"][start:], offsets[chunk.index]
                    )
                offsets[chunk.index] += len(text)
                reason, matched = finish_reason_of(chunk.out["meta_info"]["finish_reason"])
                if chunk.finished:
                    finals[chunk.index] = chunk.out
                if not text and reason is None and logprobs is None:
                    continue
                choice = CompletionChoice(
                    index=chunk.index, text=text, logprobs=logprobs, finish_reason=reason, matched_stop=matched
                )
                yield sse(CompletionStreamResponse(id=rid, model=model, choices=[choice]))
            if req.stream_options and req.stream_options.include_usage and len(finals) == len(call.states):
                ordered = [finals[i] for i in range(len(call.states))]
                yield sse(CompletionStreamResponse(id=rid, model=model, choices=[], usage=make_usage(ordered, req.n)))
        except Exception as err:  # noqa: BLE001 - report in-band, the stream has started
            logger.exception("completion stream failed")
            yield sse(error_body(str(err), 500, "InternalServerError"))
        yield SSE_DONE
