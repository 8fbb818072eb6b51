"""OpenAIServingBase: the request flow /v1/completions and /v1/chat/completions share.

parse the body -> build a GenerateReqInput -> submit it, then either one JSON response (choices
in index order, usage over all of them, 499 when the client left) or an SSE stream (the
subclass's choices for each chunk, finals tracked for the optional usage chunk, errors reported
in-band, `[DONE]` last). Subclasses say what the request model is, how it becomes a
GenerateReqInput and how an output becomes a choice.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, AsyncIterator, ClassVar, Optional

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from sglang.srt.entrypoints.openai.sampling_defaults import sampling_defaults
from sglang.srt.entrypoints.openai.protocol import ResponseBase, SamplingExtensions, UsageInfo, random_id
from sglang.srt.entrypoints.openai.utils import (
    SSE_DONE,
    OpenAIError,
    error_body,
    finish_reason_of,
    check_constrained_decoding,
    check_unsupported,
    rejected_response,
    chunk_usage,
    from_error,
    make_usage,
    parse_model,
    sse,
    status_error_response,
)
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang.srt.managers.tokenizer.tokenizer_state import GenerateCall, ReqChunk, RequestRejected

logger = logging.getLogger(__name__)


def finish_fields(out: dict) -> dict[str, Any]:
    """`finish_reason` and `matched_stop` of an SGLang output, as choice keyword arguments."""
    reason, matched = finish_reason_of(out["meta_info"]["finish_reason"])
    return {"finish_reason": reason, "matched_stop": matched}


def logprob_entries(out: dict, start: int = 0) -> tuple[list, list]:
    """(token logprobs, top logprobs) of an SGLang output from position `start` on."""
    meta = out["meta_info"]
    return meta["output_token_logprobs"][start:], meta["output_top_logprobs"][start:]


class OpenAIServingBase(ABC):
    """One OpenAI endpoint on top of a TokenizerManager; `handle` is what the HTTP route calls."""

    request_cls: ClassVar[type[SamplingExtensions]]
    response_cls: ClassVar[type[ResponseBase]]
    stream_response_cls: ClassVar[type[ResponseBase]]
    id_prefix: ClassVar[str]

    def __init__(self, tokenizer_manager: TokenizerManager):
        self.tm = tokenizer_manager
        self.server_args = tokenizer_manager.server_args
        # under a request's own sampling parameters: generation_config.json's (--sampling-defaults model)
        self.default_sampling = sampling_defaults(self.server_args)

    @abstractmethod
    def _build(self, req: Any) -> GenerateReqInput:
        """Validate the parsed request (OpenAIError / ValueError) and turn it into a generate call."""

    @abstractmethod
    def _choice(self, req: Any, index: int, out: dict) -> BaseModel:
        """The choice of one finished output (non-streaming response)."""

    @abstractmethod
    def _stream_choices(self, req: Any, chunk: ReqChunk, first: bool) -> list[BaseModel]:
        """The choices to send for one chunk, one SSE event each; `first`: first chunk of its index."""

    async def handle(self, body: Any, raw_request: Any = None):
        """Serve one request body: a JSONResponse, a StreamingResponse or an error response."""
        try:
            req = parse_model(self.request_cls, body)
            check_constrained_decoding(req, build=False)  # the scheduler builds the grammar
            check_unsupported(req)
            obj = self._build(req)
            call = await self.tm.submit(obj)
        except OpenAIError as err:
            return from_error(err)
        except ValueError as err:
            return from_error(OpenAIError(str(err)))
        if req.stream:
            # the first chunk before the headers: a request the scheduler refuses gets its status
            chunks = self.tm.iter_chunks(call, raw_request)
            try:
                first = await chunks.__anext__()
            except StopAsyncIteration:
                return JSONResponse(
                    error_body("client disconnected", 499, "ClientDisconnected"), status_code=499
                )
            except RequestRejected as err:
                return rejected_response(req, err.message, err.status)
            return StreamingResponse(self._stream(req, call, first, chunks), media_type="text/event-stream")
        try:
            return await self._complete(req, call, raw_request)
        except RequestRejected as err:
            return rejected_response(req, err.message, err.status)

    async def _complete(self, req: Any, call: GenerateCall, raw_request: Any) -> JSONResponse:
        ordered = await self.tm.collect_outputs(call, raw_request)
        if ordered is None:
            return JSONResponse(error_body("client disconnected", 499, "ClientDisconnected"), status_code=499)
        resp = self.response_cls(
            id=random_id(self.id_prefix),
            model=self.server_args.served_model_name,
            choices=[self._choice(req, i, out) for i, out in enumerate(ordered)],
            usage=make_usage(ordered, req.n),
        )
        return JSONResponse(resp.model_dump(exclude_none=True))

    async def _stream(
        self, req: Any, call: GenerateCall, first_chunk: ReqChunk, rest: AsyncIterator[ReqChunk]
    ) -> AsyncIterator[str]:
        rid = random_id(self.id_prefix)
        model = self.server_args.served_model_name
        finals: dict[int, dict] = {}
        seen: set[int] = set()
        continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)

        def event(choices: list[BaseModel], usage: Optional[UsageInfo] = None) -> str:
            return sse(self.stream_response_cls(id=rid, model=model, choices=choices, usage=usage))

        async def chunks() -> AsyncIterator[ReqChunk]:
            yield first_chunk
            async for chunk in rest:
                yield chunk

        try:
            async for chunk in chunks():
                first = chunk.index not in seen
                seen.add(chunk.index)
                if chunk.finished:
                    finals[chunk.index] = chunk.out
                usage = chunk_usage(chunk.out) if continuous else None  # usage in every chunk
                for choice in self._stream_choices(req, chunk, first):
                    yield event([choice], usage)
            if req.stream_options and req.stream_options.include_usage and len(finals) == len(call.states):
                ordered = [finals[i] for i in range(len(call.states))]
                yield event([], make_usage(ordered, req.n))
        except Exception as err:  # noqa: BLE001 - report in-band, the stream has started
            logger.exception("%s stream failed", self.id_prefix)
            yield sse(error_body(str(err), 500, "InternalServerError"))
        finally:
            await rest.aclose()  # aborts what is unfinished (client gone)
        yield SSE_DONE
