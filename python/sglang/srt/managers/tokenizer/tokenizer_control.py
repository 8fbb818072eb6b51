"""Control calls from the TokenizerManager to the scheduler that never wait behind a busy one.

The scheduler's watchdog thread sends a `SchedulerHeartbeat` (state snapshot, step counters)
every 0.5 s even while a long forward runs, so `get_internal_state_reply` answers from it when
the loop does not reply within `STATE_WAIT_S`, `flush_cache` refuses at once while requests run
(or when the scheduler has been silent), and the health probe can tell a busy scheduler (steps
finishing, or one step running within `--watchdog-timeout`) from a stuck one (`health_verdict`).

Replies come back in the order the messages were sent (one future per message, FIFO, 1:1).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional

from sglang.srt.managers.io_struct import (
    ClearHiCacheReqInput,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GetInternalStateReqInput,
    GetInternalStateReqOutput,
    ProfileReqInput,
    ProfileReqOutput,
    SchedulerHeartbeat,
)
from sglang.srt.managers.tokenizer.tokenizer_state import SchedulerUnavailable

STATE_WAIT_S = 0.5  # then /get_server_info answers from the latest heartbeat's snapshot
FLUSH_WAIT_S = 1.0  # asked only when no request is running: an idle scheduler answers in ms
PROFILE_WAIT_S = 120.0  # a stop writes the trace first (seconds for a long profile)
HEARTBEAT_STALE_S = 5.0  # no heartbeat for this long: the scheduler process is not responding
CONTROL_STALE_S = 1.5  # a flush is not even asked of a scheduler silent for this long (3 beats)


class SchedulerControl:
    """Heartbeats received from the scheduler and the control messages waiting for a reply.

    `send` puts one message on the socket to the scheduler; `start()` must run on the event loop
    that awaits the replies (the TokenizerManager's)."""

    def __init__(self, send: Callable[[Any], None]):
        self.send = send
        self.lock: Optional[asyncio.Lock] = None
        self.flush_waiters: list[asyncio.Future] = []
        self.state_waiters: list[asyncio.Future] = []
        self.profile_waiters: list[asyncio.Future] = []
        self.state_inflight: Optional[asyncio.Future] = None  # concurrent state calls share one
        self.last_heartbeat: Optional[SchedulerHeartbeat] = None
        self.last_heartbeat_recv: Optional[float] = None  # monotonic

    def start(self) -> None:
        self.lock = asyncio.Lock()

    # ------------------------------------------------------------------ receive side
    def on_message(self, obj: Any) -> bool:
        """Take a heartbeat or a control reply; False for any other message."""
        if isinstance(obj, SchedulerHeartbeat):
            self.last_heartbeat = obj
            self.last_heartbeat_recv = time.monotonic()
        elif isinstance(obj, FlushCacheReqOutput):
            self._resolve(self.flush_waiters, obj)
        elif isinstance(obj, GetInternalStateReqOutput):
            self._resolve(self.state_waiters, obj)
        elif isinstance(obj, ProfileReqOutput):
            self._resolve(self.profile_waiters, obj)
        else:
            return False
        return True

    @staticmethod
    def _resolve(waiters: list[asyncio.Future], value: Any) -> None:
        """The reply to the oldest control message of its kind (a caller that gave up left its
        future in place, so later replies still meet their own callers)."""
        if waiters:
            fut = waiters.pop(0)
            if not fut.done():
                fut.set_result(value)

    def fail(self, message: str) -> None:
        """The engine died: every caller still waiting gets a RuntimeError."""
        for fut in self.flush_waiters + self.state_waiters + self.profile_waiters:
            if not fut.done():
                fut.set_exception(RuntimeError(message))
                fut.exception()  # callers that gave up will never read it: no "never retrieved" noise

    # ------------------------------------------------------------------ heartbeats
    def heartbeat_age(self) -> Optional[float]:
        """Seconds since the scheduler's last heartbeat (None before the first)."""
        if self.last_heartbeat_recv is None:
            return None
        return time.monotonic() - self.last_heartbeat_recv

    def fresh_heartbeat(self) -> Optional[SchedulerHeartbeat]:
        age = self.heartbeat_age()
        return self.last_heartbeat if age is not None and age < HEARTBEAT_STALE_S else None

    # ------------------------------------------------------------------ calls
    def _send_control(self, waiters: list[asyncio.Future], msg: Any) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        waiters.append(fut)
        self.send(msg)
        return fut

    async def _ask(self, waiters: list[asyncio.Future], msg: Any, timeout_s: float, reply_cls: Any) -> Any:
        """Send `msg` (one control call at a time) and wait for its reply; `reply_cls(False, why)`
        when the scheduler does not answer within `timeout_s`."""
        async with self.lock:
            fut = self._send_control(waiters, msg)
            try:
                return await asyncio.wait_for(asyncio.shield(fut), timeout=timeout_s)
            except asyncio.TimeoutError:
                return reply_cls(False, f"the scheduler did not answer within {timeout_s:g} s")

    async def flush_cache(self, num_running: int) -> FlushCacheReqOutput:
        """Flush the radix cache; refused at once (never queued behind work) while requests run."""
        if num_running:
            return FlushCacheReqOutput(
                False, f"cannot flush the cache while {num_running} request(s) are running"
            )
        # No request known to the tokenizer means an idle scheduler (requests leave its table only
        # when the scheduler reported them finished): it answers in milliseconds, unless frozen.
        age = self.heartbeat_age()
        if age is not None and age >= CONTROL_STALE_S:
            return FlushCacheReqOutput(False, f"the scheduler has not responded for {age:.1f} s")
        return await self._ask(self.flush_waiters, FlushCacheReqInput(), FLUSH_WAIT_S, FlushCacheReqOutput)

    async def clear_hicache_storage(self, timeout_s: float) -> FlushCacheReqOutput:
        """Every rank deletes its HiCache storage pages (`ClearHiCacheReqInput`); its reply is a
        FlushCacheReqOutput, resolved in order with the flushes. Allowed while requests run."""
        return await self._ask(self.flush_waiters, ClearHiCacheReqInput(), timeout_s, FlushCacheReqOutput)

    async def profile(self, msg: ProfileReqInput) -> ProfileReqOutput:
        """Start or stop torch.profiler on every scheduler rank (applied between two steps)."""
        return await self._ask(self.profile_waiters, msg, PROFILE_WAIT_S, ProfileReqOutput)

    async def get_internal_state_reply(self, max_wait_s: float = STATE_WAIT_S) -> GetInternalStateReqOutput:
        """The scheduler's `internal_state()` (`.state`; with attention DP the merged figures, and
        `.replica_states` one per replica): its reply when it comes within `max_wait_s`, else the
        snapshot of its latest heartbeat (with `snapshot_age_s` / `step_running_s`), so a busy
        scheduler never makes an info endpoint wait. Concurrent callers share one request."""
        fut = self.state_inflight
        if fut is None or fut.done():
            fut = self.state_inflight = self._send_control(self.state_waiters, GetInternalStateReqInput())
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

    def health_verdict(self, beat: Optional[SchedulerHeartbeat], timeout_s: float) -> tuple[bool, str]:
        """(healthy, why) of a health probe whose token did not come back within `timeout_s` and
        saw no progress: a scheduler still inside one step is busy, not stuck, until
        --watchdog-timeout (then its watchdog ends the server); a silent one is stuck."""
        if beat is None:
            age = self.heartbeat_age()
            if age is None:
                return False, "the scheduler has sent no heartbeat"
            return False, f"the scheduler has not responded for {age:.0f} s"
        if beat.busy_since is not None:
            running = time.time() - beat.busy_since
            if running < beat.watchdog_timeout:
                return True, f"busy: one step has run for {running:.0f} s (within --watchdog-timeout)"
            return False, f"stuck: one step has run for {running:.0f} s"
        return False, f"no generation progress in {timeout_s:g} s"
