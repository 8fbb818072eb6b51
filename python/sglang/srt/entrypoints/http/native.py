"""SGLang's native routes: /health, /health_generate, /get_model_info and /generate."""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from sglang.srt.entrypoints.http.common import read_json
from sglang.srt.entrypoints.openai.utils import (
    SSE_DONE,
    error_body,
    error_response,
    sse,
    status_error_response,
)
from sglang.srt.managers.tokenizer.tokenizer_input import generate_req_from_dict
from sglang.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang.srt.managers.tokenizer.tokenizer_state import RequestRejected
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class NativeRoutes:
    """The native API of one TokenizerManager (`router()` registers the routes)."""

    def __init__(self, tokenizer_manager: TokenizerManager, server_args: ServerArgs):
        self.tm = tokenizer_manager
        self.args = server_args

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/health", self.health, methods=["GET"])
        router.add_api_route("/health_generate", self.health_generate, methods=["GET"])
        router.add_api_route("/get_model_info", self.get_model_info, methods=["GET"])
        router.add_api_route("/generate", self.generate, methods=["POST"])
        return router

    # ------------------------------------------------------------------ health and info
    async def health(self) -> Response:
        if self.tm.dead_message is not None:
            return PlainTextResponse(self.tm.dead_message, status_code=503)
        return Response(status_code=200)

    async def health_generate(self) -> Response:
        """200 while generation progresses (a busy scheduler is healthy); 503 only when it is stuck."""
        try:
            healthy, why = await self.tm.health_generate()
        except Exception as err:  # noqa: BLE001 - any failure means unhealthy
            healthy, why = False, repr(err)
        if not healthy:
            logger.warning("/health_generate: unhealthy: %s", why)
            return PlainTextResponse(f"unhealthy: {why}", status_code=503)
        return Response(status_code=200)

    async def get_model_info(self) -> dict:
        return {
            "model_path": self.args.model_path,
            "tokenizer_path": self.args.tokenizer_path,
            "served_model_name": self.args.served_model_name,
            "is_generation": True,
            "context_length": self.tm.scheduler_info.context_len,
            "vocab_size": self.tm.scheduler_info.vocab_size,
        }

    # ------------------------------------------------------------------ generate
    async def generate(self, request: Request) -> Response:
        body = await read_json(request)
        try:
            obj = generate_req_from_dict(body)
            call = await self.tm.submit(obj)
        except (TypeError, ValueError) as err:
            return error_response(str(err))
        results = self.tm.iter_results(call, request)
        if obj.stream:
            return await _stream_response(results)
        result = None
        try:
            async for out in results:
                result = out
        except RequestRejected as err:
            return status_error_response(err.message, err.status)
        if result is None:
            return error_response("client disconnected", 499, "ClientDisconnected")
        return JSONResponse(result)


async def _stream_response(results: AsyncIterator[Any]) -> Response:
    """SSE of a streaming /generate. The first chunk comes before the headers, so that a request
    the scheduler refuses gets its status; later errors are reported in-band."""
    try:
        first = await results.__anext__()
    except StopAsyncIteration:
        return error_response("client disconnected", 499, "ClientDisconnected")
    except RequestRejected as err:
        return status_error_response(err.message, err.status)

    async def stream() -> AsyncIterator[str]:
        try:
            yield sse(first)
            async for out in results:
                yield sse(out)
        except Exception as err:  # noqa: BLE001 - the stream has started: report in-band
            logger.exception("generate stream failed")
            yield sse(error_body(str(err), 500, "InternalServerError"))
        finally:
            await results.aclose()  # aborts what is unfinished (client gone)
        yield SSE_DONE

    return StreamingResponse(stream(), media_type="text/event-stream")
