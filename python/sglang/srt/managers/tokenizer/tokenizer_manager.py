"""TokenizerManager: the main-process, asyncio side of the engine.

It validates and tokenizes requests (`tokenizer_input.prepare_requests`), sends them to the
scheduler, receives incremental text from the detokenizer and turns it into SGLang-shaped results:
`{"text", "output_ids", "meta_info": {...}}` with cumulative `text` and `output_ids`.

One TokenizerManager lives in one event loop: its receive socket and the task that reads it are
created on the loop of the first call (`_ensure_started`). Its parts, one module each:
`tokenizer_state.py` (per-request state, the errors of the request path), `tokenizer_output.py`
(detokenizer output folded into the states, results and streaming chunks, request metrics),
`tokenizer_control.py` (heartbeats, flush / internal state / health that never wait behind a
busy scheduler), `request_validation.py` (the request's bootstrap fields).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, AsyncIterator, Optional, Union

import zmq
import zmq.asyncio

from sglang.srt import envs
from sglang.srt.disaggregation.role import DisaggregationRole
from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchStrOut,
    FlushCacheReqOutput,
    GenerateReqInput,
    GetInternalStateReqOutput,
    ProfileReqInput,
    ProfileReqOutput,
    SchedulerReadyInfo,
    TokenizedGenerateReqInput,
)
from sglang.srt.managers.tokenizer.request_validation import bootstrap_of, check_bootstrap
from sglang.srt.managers.tokenizer.tokenizer_control import STATE_WAIT_S, SchedulerControl
from sglang.srt.managers.tokenizer.request_log import RequestLogger
from sglang.srt.managers.tokenizer.tokenizer_input import prepare_requests
from sglang.srt.managers.tokenizer.tokenizer_output import (
    OutputBuilder,
    RequestMetricsRecorder,
    apply_batch_str,
)
from sglang.srt.managers.tokenizer.tokenizer_state import (
    HEALTH_RID_PREFIX,
    GenerateCall,
    ReqChunk,
    ReqState,
    RequestRejected,
    SchedulerUnavailable,
    finish,
    next_index,
    raise_if_rejected,
)
from sglang.srt.metrics.collector import ServerMetrics
from sglang.srt.server_args import PortArgs, ServerArgs

# Names importers take from here (the request path's public surface).
__all__ = [
    "GenerateCall",
    "ReqChunk",
    "ReqState",
    "RequestRejected",
    "SchedulerUnavailable",
    "TokenizerManager",
]

logger = logging.getLogger(__name__)

HEALTH_POLL_S = 0.1
HEALTH_PROBE_GONE_S = 1.0  # an aborted probe leaves at the scheduler's next step


class TokenizerManager:
    """Tokenizes requests, talks to the scheduler over ZMQ and assembles results."""

    def __init__(
        self,
        server_args: ServerArgs,
        port_args: PortArgs,
        scheduler_info: SchedulerReadyInfo,
        tokenizer: Optional[Any] = None,
    ):
        self.server_args = server_args
        self.port_args = port_args
        self.scheduler_info = scheduler_info
        self.tokenizer = tokenizer
        self.pd = DisaggregationRole.of(server_args)  # PD: requests' bootstrap fields, the health probe
        self.context = zmq.asyncio.Context(2)
        self.send_to_scheduler = self.context.socket(zmq.PUSH)
        self.send_to_scheduler.connect(port_args.scheduler_input_ipc_name)
        self.recv_socket: Optional[zmq.asyncio.Socket] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.handle_task: Optional[asyncio.Task] = None
        self.rid_to_state: dict[str, ReqState] = {}
        self.rid_children: dict[str, list[str]] = {}
        self.control = SchedulerControl(self.send_to_scheduler.send_pyobj)
        self.outputs = OutputBuilder(tokenizer)
        self.num_outputs_received = 0  # BatchStrOut messages (health: is generation moving?)
        self.dead_message: Optional[str] = None
        self.request_logger = RequestLogger.of(server_args)  # --log-requests
        # The processes started for this manager (a launch.ChildProcesses), set by the launcher.
        self.child_processes: Optional[Any] = None
        self.metrics: Optional[ServerMetrics] = None
        self.recorder: Optional[RequestMetricsRecorder] = None
        if server_args.enable_metrics:
            self.metrics = ServerMetrics(
                server_args.served_model_name,
                pp_size=server_args.pp_size,
                dp_size=server_args.dp_size if server_args.enable_dp_attention else 1,
            )
            self.recorder = RequestMetricsRecorder(self.metrics)

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        """Bind the receive socket and start reading it on the running loop (also done lazily)."""
        self._ensure_started()

    def _ensure_started(self) -> None:
        if self.handle_task is not None:
            return
        self.loop = asyncio.get_running_loop()
        self.recv_socket = self.context.socket(zmq.PULL)
        self.recv_socket.bind(self.port_args.tokenizer_ipc_name)
        self.control.start()
        self.handle_task = self.loop.create_task(self._handle_loop())

    def close(self) -> None:
        """Close the sockets (the processes are stopped by the launcher)."""
        if self.handle_task is not None:
            self.handle_task.cancel()
        self.context.destroy(linger=0)

    def set_dead(self, message: str) -> None:
        """A child process died: fail every pending request and refuse new ones."""
        self.dead_message = message
        for state in list(self.rid_to_state.values()):
            state.error = message
            finish(state, {"type": "abort", "message": message})
        self.rid_to_state.clear()
        self.control.fail(message)

    def _check_alive(self) -> None:
        if self.dead_message is not None:
            raise RuntimeError(self.dead_message)

    # ------------------------------------------------------------------ receive side
    async def _handle_loop(self) -> None:
        while True:
            try:
                obj = await self.recv_socket.recv_pyobj()
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError:
                return
            try:
                self._dispatch(obj)
            except Exception:  # noqa: BLE001 - never let one message stop the loop
                logger.exception("failed to handle %s", type(obj).__name__)

    def _dispatch(self, obj: Any) -> None:
        if isinstance(obj, BatchStrOut):
            self.num_outputs_received += 1
            apply_batch_str(obj, self.rid_to_state, self.recorder)
        elif not self.control.on_message(obj):
            logger.warning("unexpected message %s", type(obj).__name__)

    # ------------------------------------------------------------------ results
    def token_text(self, tid: int) -> Optional[str]:
        return self.outputs.token_text(tid)

    def build_output(self, state: ReqState) -> dict:
        """The SGLang-shaped dict of a request so far (cumulative text and output ids)."""
        return self.outputs.build_output(state)

    # ------------------------------------------------------------------ requests
    async def submit(self, obj: GenerateReqInput) -> GenerateCall:
        """Validate, register and send every request of `obj` (ValueError on bad input)."""
        self._ensure_started()
        self._check_alive()
        reqs = prepare_requests(
            obj,
            self.tokenizer,
            self.scheduler_info,
            set(self.rid_to_state),
            self.server_args.allow_auto_truncate,
        )
        check_bootstrap(obj, self.pd, len(reqs))  # PD: bootstrap fields
        call = GenerateCall(obj=obj, reqs=reqs, is_single=obj.is_single and len(reqs) == 1)
        for req in reqs:
            state = ReqState(req=req, call=call)
            call.states.append(state)
            self.rid_to_state[req.rid] = state
        if isinstance(obj.rid, str) and len(reqs) > 1:
            self.rid_children[obj.rid] = [r.rid for r in reqs]
        for req in reqs:
            if self.request_logger is not None:
                self.request_logger.received(req)
            self.send_to_scheduler.send_pyobj(
                TokenizedGenerateReqInput(
                    rid=req.rid,
                    input_text=req.input_text,
                    input_ids=req.input_ids,
                    sampling_params=req.sampling_params,
                    stream=req.stream,
                    return_logprob=req.return_logprob,
                    top_logprobs_num=req.top_logprobs_num,
                    logprob_start_len=req.logprob_start_len,
                    token_ids_logprob=req.token_ids_logprob,
                    **self._bootstrap_fields(obj, req.index),
                )
            )
        return call

    def _bootstrap_fields(self, obj: GenerateReqInput, index: int) -> dict:
        """PD: the prompt's bootstrap host / port / room for the scheduler (none on a normal server)."""
        if not self.pd.enabled:
            return {}
        host, port, room = bootstrap_of(obj, index)
        return {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}

    async def iter_chunks(self, call: GenerateCall, request: Any = None) -> AsyncIterator[ReqChunk]:
        """Yield a ReqChunk whenever a request of the call progresses (stream) or finishes.

        Unfinished requests are aborted when the consumer stops early (client disconnect,
        cancellation, exception), so the scheduler frees their KV cache. Raises RuntimeError
        when a child process died under the call.
        """
        pending = {s.req.index for s in call.states}
        try:
            while pending:
                try:
                    index = await next_index(call.queue)
                except asyncio.TimeoutError:
                    if request is not None and await request.is_disconnected():
                        logger.info("client disconnected: aborting %d request(s)", len(pending))
                        return
                    continue
                chunk = self._next_chunk(call, call.states[index])
                if chunk is None:
                    continue
                if chunk.finished:
                    pending.discard(index)
                    if self.request_logger is not None:
                        self.request_logger.finished(chunk.rid, chunk.out)
                yield chunk
        finally:
            for state in call.states:
                if not state.finished and state.req.rid in self.rid_to_state:
                    self.abort_request(state.req.rid)
            if isinstance(call.obj.rid, str):
                self.rid_children.pop(call.obj.rid, None)

    def _next_chunk(self, call: GenerateCall, state: ReqState) -> Optional[ReqChunk]:
        """The chunk to hand out for a request that progressed (None: nothing to hand out yet:
        a non-streaming request that has not finished, or nothing new)."""
        if state.error is not None:
            raise RuntimeError(state.error)
        raise_if_rejected(state)
        if state.yielded_finished:
            return None
        if not state.finished and not call.obj.stream:
            return None
        return self.outputs.take_chunk(state)

    async def generate_request(
        self, obj: GenerateReqInput, request: Any = None
    ) -> AsyncIterator[Union[dict, list[dict]]]:
        """SGLang's native results: one dict (or list) when not streaming, else one dict per chunk.

        Batch streams carry `"index"` in each chunk; validation errors raise ValueError before
        anything is yielded.
        """
        call = await self.submit(obj)
        async for out in self.iter_results(call, request):
            yield out

    async def iter_results(
        self, call: GenerateCall, request: Any = None
    ) -> AsyncIterator[Union[dict, list[dict]]]:
        """Results of an already submitted call (see `generate_request`)."""
        if call.obj.stream:
            async for chunk in self.iter_chunks(call, request):
                if not call.is_single:
                    chunk.out["index"] = chunk.index
                yield chunk.out
            return
        ordered = await self.collect_outputs(call, request)
        if ordered is None:
            return  # client gone
        yield ordered[0] if call.is_single else ordered

    async def collect_outputs(self, call: GenerateCall, request: Any = None) -> Optional[list[dict]]:
        """The final output of every request of `call`, in index order; None if the client left."""
        outs: dict[int, dict] = {}
        async for chunk in self.iter_chunks(call, request):
            outs[chunk.index] = chunk.out
        if len(outs) < len(call.states):
            return None
        return [outs[i] for i in range(len(call.states))]

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """Ask the scheduler to stop `rid` (and its n>1 siblings); the result ends with finish type abort."""
        rids = self.rid_children.get(rid, [rid]) if not abort_all else [""]
        for r in rids:
            self.send_to_scheduler.send_pyobj(AbortReq(rid=r, abort_all=abort_all))

    # ------------------------------------------------------------------ control
    def heartbeat_age(self) -> Optional[float]:
        """Seconds since the scheduler's last heartbeat (None before the first)."""
        return self.control.heartbeat_age()

    async def flush_cache(self) -> FlushCacheReqOutput:
        """Flush the radix cache; refused at once (never queued behind work) while requests run."""
        self._ensure_started()
        self._check_alive()
        return await self.control.flush_cache(len(self.rid_to_state))

    async def clear_hicache_storage(self, timeout_s: float) -> FlushCacheReqOutput:
        """/clear_hicache_storage_backend: every rank deletes its HiCache storage pages."""
        self._ensure_started()
        self._check_alive()
        return await self.control.clear_hicache_storage(timeout_s)

    async def profile(self, msg: ProfileReqInput) -> ProfileReqOutput:
        """/start_profile, /stop_profile: torch.profiler on every scheduler rank."""
        self._ensure_started()
        self._check_alive()
        return await self.control.profile(msg)

    async def get_internal_state_reply(self, max_wait_s: float = STATE_WAIT_S) -> GetInternalStateReqOutput:
        """The scheduler's internal state, or its latest heartbeat's snapshot when it is busy
        (`SchedulerControl.get_internal_state_reply`); SchedulerUnavailable when neither comes."""
        self._ensure_started()
        self._check_alive()
        return await self.control.get_internal_state_reply(max_wait_s)

    async def get_internal_state(self, max_wait_s: float = STATE_WAIT_S) -> dict:
        return (await self.get_internal_state_reply(max_wait_s)).state

    async def health_generate(self, timeout_s: Optional[float] = None) -> tuple[bool, str]:
        """(healthy, why): generate one token; healthy as soon as it comes back, or as soon as the
        scheduler is seen making progress (other outputs arriving, steps finishing). At the
        deadline a scheduler still inside one step is busy, not stuck, until --watchdog-timeout
        (then its watchdog ends the server); a silent scheduler or one that finishes no step is stuck."""
        self._ensure_started()
        if self.dead_message is not None:
            return False, self.dead_message
        if timeout_s is None:
            timeout_s = envs.SGLANG_HEALTH_CHECK_TIMEOUT.get()
        outputs_before = self.num_outputs_received
        beat = self.control.fresh_heartbeat()
        steps_before = beat.steps_finished if beat is not None else None
        call = await self.submit(self._health_probe_request())
        state = call.states[0]
        verdict = (False, "")
        try:
            verdict = await self._watch_probe(state, outputs_before, steps_before, timeout_s)
            return verdict
        finally:
            if not state.finished and state.req.rid in self.rid_to_state:
                self.abort_request(state.req.rid)
                if verdict[0]:  # a scheduler making progress drops the probe at its next step
                    await self._probe_gone(state.req.rid)

    async def _watch_probe(
        self, state: ReqState, outputs_before: int, steps_before: Optional[int], timeout_s: float
    ) -> tuple[bool, str]:
        """health_generate's verdict: the probe came back, or the scheduler made progress, or (at
        the deadline) the control channel's busy / stuck verdict."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.dead_message is not None:
                return False, self.dead_message
            if state.finished:
                return True, "generated"
            if self.num_outputs_received > outputs_before:
                return True, "generating (outputs arriving)"
            beat = self.control.fresh_heartbeat()
            if beat is not None and steps_before is not None and beat.steps_finished > steps_before:
                return True, "generating (steps finishing)"
            if steps_before is None and beat is not None:
                steps_before = beat.steps_finished
            if time.monotonic() >= deadline:
                return self.control.health_verdict(beat, timeout_s)
            await asyncio.sleep(HEALTH_POLL_S)

    async def _probe_gone(self, rid: str) -> None:
        """Wait (at most HEALTH_PROBE_GONE_S) until an aborted health probe has left the request table,
        so that an answered /health_generate leaves no request behind: a /flush_cache right after it
        is not refused for the probe (seen on a PD decode server, whose probe waits for a transfer
        while its steps finish)."""
        deadline = time.monotonic() + HEALTH_PROBE_GONE_S
        while rid in self.rid_to_state and self.dead_message is None and time.monotonic() < deadline:
            await asyncio.sleep(HEALTH_POLL_S / 10)

    def _health_probe_request(self) -> GenerateReqInput:
        """One greedy token from token id 0, under a rid the metrics skip."""
        obj = GenerateReqInput(
            input_ids=[0],
            sampling_params={"max_new_tokens": 1, "temperature": 0.0},
            rid=f"{HEALTH_RID_PREFIX}{uuid.uuid4().hex}",
        )
        if self.pd.enabled:  # PD: a self-contained request (fake transfer backend)
            from sglang.srt.disaggregation.messages import fake_bootstrap

            obj = fake_bootstrap(obj)
        return obj

    @property
    def num_running(self) -> int:
        return len(self.rid_to_state)
