"""Operator routes: /get_server_info (alias /server_info), /metrics (with --enable-metrics),
/flush_cache and /abort_request. None waits behind a busy scheduler (`tokenizer_control.py`)."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from sglang.srt.entrypoints.engine import server_info
from sglang.srt.entrypoints.http.common import read_json
from sglang.srt.entrypoints.openai.utils import OpenAIError, error_response
from sglang.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang.srt.managers.tokenizer.tokenizer_state import SchedulerUnavailable
from sglang.srt.metrics.collector import CONTENT_TYPE as METRICS_CONTENT_TYPE

logger = logging.getLogger(__name__)

METRICS_STATE_TIMEOUT_S = 5.0  # a scrape waits at most this long for the scheduler's gauges


class AdminRoutes:
    """Server info, metrics, cache flush and abort of one TokenizerManager (`router()`)."""

    def __init__(self, tokenizer_manager: TokenizerManager):
        self.tm = tokenizer_manager

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/get_server_info", self.get_server_info, methods=["GET"])
        router.add_api_route("/server_info", self.get_server_info, methods=["GET"])
        if self.tm.metrics is not None:
            router.add_api_route("/metrics", self.metrics, methods=["GET"])
        router.add_api_route("/flush_cache", self.flush_cache, methods=["GET", "POST"])
        router.add_api_route("/abort_request", self.abort_request, methods=["POST"])
        return router

    async def get_server_info(self) -> Response:
        try:
            state = await self.tm.get_internal_state_reply()
        except SchedulerUnavailable as err:
            return error_response(str(err), 503, "ServiceUnavailableError")
        return JSONResponse(server_info(self.tm, state))

    async def metrics(self) -> Response:
        # Scheduler gauges are pulled at scrape time; on timeout the previous values stay.
        try:
            reply = await asyncio.wait_for(
                self.tm.get_internal_state_reply(), timeout=METRICS_STATE_TIMEOUT_S
            )
            self.tm.metrics.update_scheduler_state(reply.state, reply.replica_states)
        except Exception as err:  # noqa: BLE001 - still serve the tokenizer-side metrics
            logger.warning("metrics: scheduler state unavailable (%r)", err)
        return Response(self.tm.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def flush_cache(self) -> Response:
        out = await self.tm.flush_cache()
        if out.success:
            return PlainTextResponse("Cache flushed.\n", status_code=200)
        return error_response(f"cache flush failed: {out.message}", 400)

    async def abort_request(self, request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("rid", ""), str):
            raise OpenAIError("'rid' must be a string")
        self.tm.abort_request(body.get("rid", ""), abort_all=bool(body.get("abort_all", False)))
        return Response(status_code=200)
