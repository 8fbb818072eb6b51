"""Operator routes: /get_server_info (alias /server_info), /metrics (with --enable-metrics),
/flush_cache, /clear_hicache_storage_backend, /abort_request, /get_load (what sglang-router's load policies read) and
/start_profile, /stop_profile (torch.profiler on every scheduler rank). None but the profile
calls waits behind a busy scheduler (`tokenizer_control.py`)."""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from sglang.srt import envs
from sglang.srt.entrypoints.engine import server_info
from sglang.srt.entrypoints.http.common import read_json
from sglang.srt.entrypoints.openai.utils import OpenAIError, error_response
from sglang.srt.managers.io_struct import ProfileReqInput
from sglang.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang.srt.managers.tokenizer.tokenizer_state import SchedulerUnavailable
from sglang.srt.metrics.collector import CONTENT_TYPE as METRICS_CONTENT_TYPE

logger = logging.getLogger(__name__)

METRICS_STATE_TIMEOUT_S = 5.0  # a scrape waits at most this long for the scheduler's gauges
CLEAR_HICACHE_WAIT_S = 30.0  # deleting the L3 files waits for the scheduler's step in flight


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
        router.add_api_route(
            "/clear_hicache_storage_backend", self.clear_hicache_storage_backend, methods=["GET", "POST"]
        )
        router.add_api_route("/abort_request", self.abort_request, methods=["POST"])
        router.add_api_route("/get_load", self.get_load, methods=["GET"])
        router.add_api_route("/start_profile", self.start_profile, methods=["GET", "POST"])
        router.add_api_route("/stop_profile", self.stop_profile, methods=["GET", "POST"])
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

    async def clear_hicache_storage_backend(self) -> Response:
        """Every rank deletes the L3 pages of its storage namespace (upstream's route); 400 when
        HiCache or its storage backend is off."""
        args = self.tm.server_args
        if not args.enable_hierarchical_cache or args.hicache_storage_backend == "none":
            return error_response(
                "HiCache storage is off (--enable-hierarchical-cache with --hicache-storage-backend)", 400
            )
        out = await self.tm.clear_hicache_storage(CLEAR_HICACHE_WAIT_S)
        if out.success:
            return PlainTextResponse(f"Hierarchical cache storage backend cleared: {out.message}.\n")
        return error_response(f"clear_hicache_storage_backend failed: {out.message}", 400)

    async def abort_request(self, request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("rid", ""), str):
            raise OpenAIError("'rid' must be a string")
        self.tm.abort_request(body.get("rid", ""), abort_all=bool(body.get("abort_all", False)))
        return Response(status_code=200)

    async def get_load(self) -> Response:
        """One entry per attention-DP rank, upstream's shape: `num_reqs` running + waiting,
        `num_waiting_reqs`, `num_tokens` KV tokens in use (sglang-router's load policies)."""
        try:
            reply = await self.tm.get_internal_state_reply()
        except SchedulerUnavailable as err:
            return error_response(str(err), 503, "ServiceUnavailableError")
        return JSONResponse([load_entry(s, d) for d, s in enumerate(reply.replica_states or [reply.state])])

    async def start_profile(self, request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise OpenAIError("the body must be a JSON object")
        out = await self.tm.profile(profile_request(body))
        if not out.success:
            return error_response(f"start_profile failed: {out.message}", 400)
        return PlainTextResponse(f"Start profiling. The trace goes to {out.message}\n")

    async def stop_profile(self) -> Response:
        out = await self.tm.profile(ProfileReqInput(action="stop"))
        if not out.success:
            return error_response(f"stop_profile failed: {out.message}", 400)
        return PlainTextResponse(f"Stop profiling. The trace was written to {out.message}\n")


def load_entry(state: dict, dp_rank: int) -> dict:
    running, waiting = state.get("num_running_reqs", 0), state.get("num_waiting_reqs", 0)
    used = max(state.get("max_total_num_tokens", 0) - state.get("available_kv_tokens", 0), 0)
    return {
        "dp_rank": state.get("dp_rank", dp_rank),
        "num_reqs": running + waiting,
        "num_waiting_reqs": waiting,
        "num_tokens": used,
    }


PROFILE_FIELDS = ("output_dir", "num_steps", "activities", "with_stack", "record_shapes", "profile_id")


def profile_request(body: dict) -> ProfileReqInput:
    """/start_profile's body (upstream's fields; every one optional) as a control message; a field
    this server does not implement (e.g. `start_step`, `profile_by_stage`) is refused by name."""
    unknown = sorted(set(body) - set(PROFILE_FIELDS))
    if unknown:
        raise OpenAIError(
            f"start_profile: field(s) {unknown} are not supported by this server", param=unknown[0]
        )
    num_steps = body.get("num_steps")
    if num_steps is not None and (not isinstance(num_steps, int) or num_steps <= 0):
        raise OpenAIError("num_steps must be a positive integer", param="num_steps")
    activities = body.get("activities") or ["CPU"]
    if not isinstance(activities, list) or not all(isinstance(a, str) for a in activities):
        raise OpenAIError("activities must be a list of strings", param="activities")
    return ProfileReqInput(
        action="start",
        output_dir=str(body.get("output_dir") or envs.SGLANG_TORCH_PROFILER_DIR.get()),
        num_steps=num_steps,
        activities=tuple(activities),
        with_stack=bool(body.get("with_stack", False)),
        record_shapes=bool(body.get("record_shapes", False)),
        profile_id=str(body.get("profile_id") or f"{time.time():.3f}"),
    )
