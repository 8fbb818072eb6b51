"""TokenizerManager: the main-process, asyncio side of the engine.

It validates and tokenizes requests (`tokenizer_input.prepare_requests`), sends them to the
scheduler, receives incremental text from the detokenizer and turns it into SGLang-shaped results:
`{"text", "output_ids", "meta_info": {...}}` with cumulative `text` and `output_ids`.

One TokenizerManager lives in one event loop: its receive socket and the task that reads it are
created on the loop of the first call (`_ensure_started`).

Control and health calls never wait behind a busy scheduler: the scheduler's watchdog thread
sends a `SchedulerHeartbeat` (state snapshot, step counters) every 0.5 s even while a long forward
runs, so `get_internal_state` answers from it when the loop does not reply within
`STATE_WAIT_S`, `flush_cache` refuses at once while requests run, and `health_generate` tells a
busy scheduler (steps finishing, or one step running within `--watchdog-timeout`) from a stuck one.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional, Union

import zmq
import zmq.asyncio

from sglang.srt import envs
from sglang.srt.disaggregation.request_fields import bootstrap_of, check_bootstrap
from sglang.srt.managers.io_struct import (
    AbortReq,
    SchedulerHeartbeat,
    BatchStrOut,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GenerateReqInput,
    GetInternalStateReqInput,
    GetInternalStateReqOutput,
    SchedulerReadyInfo,
    TokenizedGenerateReqInput,
)
from sglang.srt.managers.tokenizer_input import PreparedReq, prepare_requests
from sglang.srt.metrics.collector import ServerMetrics
from sglang.srt.server_args import PortArgs, ServerArgs

logger = logging.getLogger(__name__)

DISCONNECT_POLL_S = 1.0
CONTROL_TIMEOUT_S = 60.0
STATE_WAIT_S = 0.5  # then /get_server_info answers from the latest heartbeat's snapshot
FLUSH_WAIT_S = 1.0  # asked only when no request is running: an idle scheduler answers in ms
HEALTH_POLL_S = 0.1
HEARTBEAT_STALE_S = 5.0  # no heartbeat for this long: the scheduler process is not responding
CONTROL_STALE_S = 1.5  # a flush is not even asked of a scheduler silent for this long (3 beats)
HEALTH_RID_PREFIX = "HEALTH_CHECK_"  # health probes: not counted in the metrics


class SchedulerUnavailable(RuntimeError):
    """The scheduler's state cannot be told right now (HTTP 503)."""


class RequestRejected(RuntimeError):
    """The scheduler refused a request before it produced anything: `status` is the HTTP status
    to answer with (400: it cannot fit; 503: --max-queued-requests reached)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass
class ReqState:
    """Accumulated output of one running request (owned by the TokenizerManager's loop)."""

    req: PreparedReq
    call: "GenerateCall"
    created_time: float = field(default_factory=time.time)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finished_reason: Optional[dict] = None
    finished: bool = False
    finished_time: Optional[float] = None
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    error: Optional[str] = None  # set when the engine died under this request
    # Arrival times of the first and the latest output tokens (metrics).
    first_token_time: Optional[float] = None
    last_token_time: Optional[float] = None
    # How much has been handed to the consumer already.
    yielded_text: int = 0
    yielded_ids: int = 0
    yielded_logprobs: int = 0
    yielded_finished: bool = False


@dataclass
class GenerateCall:
    """All requests of one generate call and the queue that tells which of them progressed."""

    obj: GenerateReqInput
    reqs: list[PreparedReq]
    states: list[ReqState] = field(default_factory=list)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    # One batch entry expands to several requests when n > 1 (the result is then a list).
    is_single: bool = True


@dataclass
class ReqChunk:
    """One streaming update of one request: the SGLang dict plus what is new in it."""

    index: int
    rid: str
    out: dict
    delta_text: str
    delta_output_ids: list[int]
    logprob_start: int  # first new entry of output_token_logprobs / output_top_logprobs
    finished: bool


async def _next_index(queue: asyncio.Queue) -> int:
    """The next progressed index of a call; asyncio.TimeoutError after DISCONNECT_POLL_S.

    Hot path of streaming (once per request per step): a ready item is taken without awaiting,
    and waiting uses `asyncio.timeout` (no extra Task per item, unlike `wait_for` before 3.12).
    """
    if not queue.empty():
        return queue.get_nowait()
    if _TIMEOUT is None:  # Python < 3.11
        return await asyncio.wait_for(queue.get(), timeout=DISCONNECT_POLL_S)
    async with _TIMEOUT(DISCONNECT_POLL_S):
        return await queue.get()


_TIMEOUT = getattr(asyncio, "timeout", None)


def _raise_if_rejected(state: ReqState) -> None:
    """RequestRejected when the scheduler refused the request outright (an abort with an HTTP
    status before any output), so that the caller answers with that status, not a 200."""
    reason = state.finished_reason or {}
    if (state.finished and reason.get("type") == "abort" and reason.get("status_code")
            and not state.output_ids and not state.yielded_finished):  # fmt: skip
        raise RequestRejected(str(reason.get("message", "rejected")), int(reason["status_code"]))


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
        self.context = zmq.asyncio.Context(2)
        self.send_to_scheduler = self.context.socket(zmq.PUSH)
        self.send_to_scheduler.connect(port_args.scheduler_input_ipc_name)
        self.recv_socket: Optional[zmq.asyncio.Socket] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.handle_task: Optional[asyncio.Task] = None
        self.rid_to_state: dict[str, ReqState] = {}
        self.rid_children: dict[str, list[str]] = {}
        self.control_lock: Optional[asyncio.Lock] = None
        # one future per control message sent, resolved in order by the replies (FIFO, 1:1)
        self.flush_waiters: list[asyncio.Future] = []
        self.state_waiters: list[asyncio.Future] = []
        self._state_inflight: Optional[asyncio.Future] = None  # concurrent state calls share one
        self.last_heartbeat: Optional[SchedulerHeartbeat] = None
        self.last_heartbeat_recv: Optional[float] = None  # monotonic
        self.num_outputs_received = 0  # BatchStrOut messages (health: is generation moving?)
        self.dead_message: Optional[str] = None
        self.token_text_cache: dict[int, str] = {}
        # The processes started for this manager (a launch.ChildProcesses), set by the launcher.
        self.child_processes: Optional[Any] = None
        self.metrics: Optional[ServerMetrics] = None
        if server_args.enable_metrics:
            self.metrics = ServerMetrics(
                server_args.served_model_name,
                pp_size=server_args.pp_size,
                dp_size=server_args.dp_size if server_args.enable_dp_attention else 1,
            )

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
        self.control_lock = asyncio.Lock()
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
            self._finish(state, {"type": "abort", "message": message})
        self.rid_to_state.clear()
        for fut in self.flush_waiters + self.state_waiters:
            if not fut.done():
                fut.set_exception(RuntimeError(message))
                fut.exception()  # callers that gave up will never read it: no "never retrieved" noise

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
            self._handle_batch_str(obj)
        elif isinstance(obj, SchedulerHeartbeat):
            self.last_heartbeat = obj
            self.last_heartbeat_recv = time.monotonic()
        elif isinstance(obj, FlushCacheReqOutput):
            self._resolve(self.flush_waiters, obj)
        elif isinstance(obj, GetInternalStateReqOutput):
            self._resolve(self.state_waiters, obj)
        else:
            logger.warning("unexpected message %s", type(obj).__name__)

    @staticmethod
    def _resolve(waiters: list[asyncio.Future], value: Any) -> None:
        """The reply to the oldest control message of its kind (a caller that gave up left its
        future in place, so later replies still meet their own callers)."""
        if waiters:
            fut = waiters.pop(0)
            if not fut.done():
                fut.set_result(value)

    def _handle_batch_str(self, out: BatchStrOut) -> None:
        now = time.time()
        for i, rid in enumerate(out.rids):
            state = self.rid_to_state.get(rid)
            if state is None:
                continue
            if self.metrics is not None:
                self._record_tokens(state, len(out.new_output_ids[i]), now)
            state.text += out.output_strs[i]
            state.output_ids.extend(out.new_output_ids[i])
            state.prompt_tokens = out.prompt_tokens[i]
            state.completion_tokens = out.completion_tokens[i]
            state.cached_tokens = out.cached_tokens[i]
            if state.req.return_logprob:
                state.output_token_logprobs.extend(out.output_token_logprobs[i] or [])
                state.output_top_logprobs.extend(out.output_top_logprobs[i] or [])
            if out.finished_reasons[i] is not None:
                self._finish(state, out.finished_reasons[i])
                del self.rid_to_state[rid]
                if self.metrics is not None:
                    self._record_finish(state)
            else:
                self._notify(state)

    def _record_tokens(self, state: ReqState, num_new: int, now: float) -> None:
        if state.req.rid.startswith(HEALTH_RID_PREFIX):
            return
        """TTFT at the first message with tokens, ITL spread over the tokens of each later one.

        Streaming or not, the scheduler reports a request's first token on its own
        (`scheduler_output.due_for_output`), so TTFT is exact for every request; a non-streaming
        request's remaining tokens arrive with its final message and share its gap evenly.
        """
        if num_new <= 0:
            return
        if state.first_token_time is None:
            state.first_token_time = now
            self.metrics.observe_ttft(now - state.created_time)
        else:
            self.metrics.observe_itl(now - state.last_token_time, num_new)
        state.last_token_time = now

    def _record_finish(self, state: ReqState) -> None:
        if state.req.rid.startswith(HEALTH_RID_PREFIX):
            return
        reason = state.finished_reason or {}
        self.metrics.observe_finish(
            prompt_tokens=state.prompt_tokens or len(state.req.input_ids),
            completion_tokens=state.completion_tokens,
            cached_tokens=state.cached_tokens,
            e2e_s=(state.finished_time or time.time()) - state.created_time,
            aborted=reason.get("type") == "abort",
        )

    def _finish(self, state: ReqState, reason: dict) -> None:
        state.finished = True
        state.finished_reason = reason
        state.finished_time = time.time()
        self._notify(state)

    @staticmethod
    def _notify(state: ReqState) -> None:
        state.event.set()
        state.call.queue.put_nowait(state.req.index)

    # ------------------------------------------------------------------ results
    def token_text(self, tid: int) -> Optional[str]:
        if self.tokenizer is None:
            return None
        text = self.token_text_cache.get(tid)
        if text is None:
            text = self.tokenizer.decode([tid])
            if len(self.token_text_cache) < 1 << 20:
                self.token_text_cache[tid] = text
        return text

    def _logprob_entries(self, pairs: list, with_text: bool) -> list:
        return [(lp, tid, self.token_text(tid) if with_text else None) for lp, tid in pairs]

    def build_output(self, state: ReqState) -> dict:
        """The SGLang-shaped dict of a request so far (cumulative text and output ids)."""
        end = state.finished_time if state.finished_time is not None else time.time()
        meta: dict[str, Any] = {
            "id": state.req.rid,
            "prompt_tokens": state.prompt_tokens or len(state.req.input_ids),
            "completion_tokens": state.completion_tokens,
            "cached_tokens": state.cached_tokens,
            "finish_reason": state.finished_reason,
            "e2e_latency": end - state.created_time,
        }
        if state.req.return_logprob:
            with_text = state.req.return_text_in_logprobs
            meta["output_token_logprobs"] = self._logprob_entries(state.output_token_logprobs, with_text)
            meta["output_top_logprobs"] = [
                self._logprob_entries(top or [], with_text) for top in state.output_top_logprobs
            ]
        return {"text": state.text, "output_ids": list(state.output_ids), "meta_info": meta}

    # ------------------------------------------------------------------ requests
    async def submit(self, obj: GenerateReqInput) -> GenerateCall:
        """Validate, register and send every request of `obj` (ValueError on bad input)."""
        self._ensure_started()
        self._check_alive()
        reqs = prepare_requests(obj, self.tokenizer, self.scheduler_info, set(self.rid_to_state))
        check_bootstrap(obj, self.server_args.disaggregation_mode, len(reqs))  # PD: bootstrap fields
        call = GenerateCall(obj=obj, reqs=reqs, is_single=obj.is_single and len(reqs) == 1)
        for req in reqs:
            state = ReqState(req=req, call=call)
            call.states.append(state)
            self.rid_to_state[req.rid] = state
        if isinstance(obj.rid, str) and len(reqs) > 1:
            self.rid_children[obj.rid] = [r.rid for r in reqs]
        for req in reqs:
            self.send_to_scheduler.send_pyobj(
                TokenizedGenerateReqInput(
                    rid=req.rid,
                    input_text=req.input_text,
                    input_ids=req.input_ids,
                    sampling_params=req.sampling_params,
                    stream=req.stream,
                    return_logprob=req.return_logprob,
                    top_logprobs_num=req.top_logprobs_num,
                    **self._bootstrap_fields(obj, req.index),
                )
            )
        return call

    def _bootstrap_fields(self, obj: GenerateReqInput, index: int) -> dict:
        """PD: the prompt's bootstrap host / port / room for the scheduler (none on a normal server)."""
        if self.server_args.disaggregation_mode == "null":
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
                    index = await _next_index(call.queue)
                except asyncio.TimeoutError:
                    if request is not None and await request.is_disconnected():
                        logger.info("client disconnected: aborting %d request(s)", len(pending))
                        return
                    continue
                state = call.states[index]
                if state.error is not None:
                    raise RuntimeError(state.error)
                _raise_if_rejected(state)
                if state.yielded_finished:
                    continue
                if not state.finished and not call.obj.stream:
                    continue
                chunk = self._take_chunk(state)
                if chunk is None:
                    continue
                if state.finished:
                    pending.discard(index)
                yield chunk
        finally:
            for state in call.states:
                if not state.finished and state.req.rid in self.rid_to_state:
                    self.abort_request(state.req.rid)
            if isinstance(call.obj.rid, str):
                self.rid_children.pop(call.obj.rid, None)

    def _take_chunk(self, state: ReqState) -> Optional[ReqChunk]:
        new_text = state.text[state.yielded_text :]
        new_ids = state.output_ids[state.yielded_ids :]
        if not new_text and not new_ids and not state.finished:
            return None
        chunk = ReqChunk(
            index=state.req.index,
            rid=state.req.rid,
            out=self.build_output(state),
            delta_text=new_text,
            delta_output_ids=new_ids,
            logprob_start=state.yielded_logprobs,
            finished=state.finished,
        )
        state.yielded_text = len(state.text)
        state.yielded_ids = len(state.output_ids)
        state.yielded_logprobs = len(state.output_token_logprobs)
        state.yielded_finished = state.finished
        return chunk

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

    async def iter_results(self, call: GenerateCall, request: Any = None) -> AsyncIterator[Union[dict, list[dict]]]:
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
        if self.last_heartbeat_recv is None:
            return None
        return time.monotonic() - self.last_heartbeat_recv

    def _fresh_heartbeat(self) -> Optional[SchedulerHeartbeat]:
        age = self.heartbeat_age()
        return self.last_heartbeat if age is not None and age < HEARTBEAT_STALE_S else None

    def _send_control(self, waiters: list[asyncio.Future], msg: Any) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        waiters.append(fut)
        self.send_to_scheduler.send_pyobj(msg)
        return fut

    async def flush_cache(self) -> FlushCacheReqOutput:
        """Flush the radix cache; refused at once (never queued behind work) while requests run."""
        self._ensure_started()
        self._check_alive()
        if self.rid_to_state:
            return FlushCacheReqOutput(False, f"cannot flush the cache while {len(self.rid_to_state)} request(s) are running")
        # No request known here means an idle scheduler (requests leave `rid_to_state` only when
        # the scheduler reported them finished): it answers in milliseconds, unless it is frozen.
        age = self.heartbeat_age()
        if age is not None and age >= CONTROL_STALE_S:
            return FlushCacheReqOutput(False, f"the scheduler has not responded for {age:.1f} s")
        async with self.control_lock:
            fut = self._send_control(self.flush_waiters, FlushCacheReqInput())
            try:
                return await asyncio.wait_for(asyncio.shield(fut), timeout=FLUSH_WAIT_S)
            except asyncio.TimeoutError:
                return FlushCacheReqOutput(False, f"the scheduler did not answer within {FLUSH_WAIT_S:g} s")

    async def get_internal_state_reply(self, max_wait_s: float = STATE_WAIT_S) -> GetInternalStateReqOutput:
        """The scheduler's `internal_state()` (`.state`; with attention DP the merged figures, and
        `.replica_states` one per replica): its reply when it comes within `max_wait_s`, else the
        snapshot of its latest heartbeat (with `snapshot_age_s` / `step_running_s`), so a busy
        scheduler never makes an info endpoint wait. Concurrent callers share one request."""
        self._ensure_started()
        self._check_alive()
        fut = self._state_inflight
        if fut is None or fut.done():
            fut = self._state_inflight = self._send_control(self.state_waiters, GetInternalStateReqInput())
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout=max_wait_s)
        except asyncio.TimeoutError:
            pass
        beat = self.last_heartbeat
        deadline = time.monotonic() + max_wait_s
        while beat is None or not beat.state:  # no snapshot yet (the first second of a server)
            if fut.done():
                return fut.result()
            if time.monotonic() >= deadline:
                raise SchedulerUnavailable(
                    f"the scheduler has not answered in {2 * max_wait_s:g} s and has sent no state yet"
                )
            await asyncio.sleep(0.02)
            beat = self.last_heartbeat
        ages = {
            "snapshot_age_s": round(time.time() - beat.state_time, 3),
            "step_running_s": None if beat.busy_since is None else round(time.time() - beat.busy_since, 3),
        }
        return GetInternalStateReqOutput(
            state={**beat.state, **ages}, replica_states=[{**s, **ages} for s in beat.replica_states]
        )

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
        beat = self._fresh_heartbeat()
        steps_before = beat.steps_finished if beat is not None else None
        obj = GenerateReqInput(
            input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0.0},
            rid=f"{HEALTH_RID_PREFIX}{uuid.uuid4().hex}",
        )  # fmt: skip
        if self.server_args.disaggregation_mode != "null":  # PD: a self-contained request (fake transfer backend)
            from sglang.srt.disaggregation.messages import fake_bootstrap

            obj = fake_bootstrap(obj)
        call = await self.submit(obj)
        state = call.states[0]
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if self.dead_message is not None:
                    return False, self.dead_message
                if state.finished:
                    return True, "generated"
                if self.num_outputs_received > outputs_before:
                    return True, "generating (outputs arriving)"
                beat = self._fresh_heartbeat()
                if beat is not None and steps_before is not None and beat.steps_finished > steps_before:
                    return True, "generating (steps finishing)"
                if steps_before is None and beat is not None:
                    steps_before = beat.steps_finished
                if time.monotonic() >= deadline:
                    break
                await asyncio.sleep(HEALTH_POLL_S)
            if beat is None:
                age = self.heartbeat_age()
                return False, ("the scheduler has sent no heartbeat" if age is None
                               else f"the scheduler has not responded for {age:.0f} s")  # fmt: skip
            if beat.busy_since is not None:
                running = time.time() - beat.busy_since
                if running < beat.watchdog_timeout:
                    return True, f"busy: one step has run for {running:.0f} s (within --watchdog-timeout)"
                return False, f"stuck: one step has run for {running:.0f} s"
            return False, f"no generation progress in {timeout_s:g} s"
        finally:
            if not state.finished and state.req.rid in self.rid_to_state:
                self.abort_request(state.req.rid)

    @property
    def num_running(self) -> int:
        return len(self.rid_to_state)
