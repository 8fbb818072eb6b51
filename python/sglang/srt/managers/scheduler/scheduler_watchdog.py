"""SchedulerWatchdog: a small thread beside the scheduler loop that sees forward progress.

The `Scheduler` holds one and tells it, from its loop, when a step (a forward, or a pipeline
micro-batch) starts and when its result is applied, and hands it a snapshot of its state now and
then. Passive until `start()` (the scheduler process starts it; in-process schedulers of tests
never do). Once started, its thread

- ends the process when a step has not finished for `--watchdog-timeout` seconds (upstream's
  watchdog): it logs where the scheduler thread is stuck (its Python stack), then exits with
  `WATCHDOG_EXIT_CODE`; the launcher sees the rank die, names it and stops the server;
- on the entry rank, sends a `SchedulerHeartbeat` to the tokenizer manager every
  `HEARTBEAT_INTERVAL_S`, also while the loop is inside a long forward: the last state snapshot,
  the step counters and how long the current step has run. Info endpoints answer from it when
  the loop cannot answer in time, and `/health_generate` tells a busy scheduler from a stuck one.

Only plain attributes are shared between the two threads (each written by one of them).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, Optional

from sglang.srt.managers.io_struct import SchedulerHeartbeat

logger = logging.getLogger(__name__)

WATCHDOG_EXIT_CODE = 86  # the launcher reports a rank that exits with it as a watchdog timeout
HEARTBEAT_INTERVAL_S = 0.5
SNAPSHOT_INTERVAL_S = 0.25  # the loop refreshes its state snapshot at most this often while busy
POLL_S = 0.25


class SchedulerWatchdog:
    """Forward-progress tracker (loop thread) and watchdog / heartbeat thread (once started)."""

    def __init__(self, timeout_s: float, rank: int = 0, dp_rank: int = 0):
        self.timeout_s = float(timeout_s)
        self.rank = rank
        self.dp_rank = dp_rank  # attention-DP replica (its heartbeats go to the DP controller)
        # written by the loop thread only
        self.steps_in_flight = 0
        self.steps_finished = 0
        self.busy_since: Optional[float] = None  # monotonic: when the current wait for a result began
        self.busy_since_wall: Optional[float] = None
        self.snapshot: dict[str, Any] = {}
        self.snapshot_time = 0.0  # wall clock of `snapshot`
        self._snapshot_mono = 0.0
        self._snapshot_busy: Optional[bool] = None
        # the thread
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._loop_thread_id: Optional[int] = None
        self.fired = False

    # ------------------------------------------------------------------ loop thread
    def step_started(self) -> None:
        """A step was launched (its result will come back through `step_finished`)."""
        if self.steps_in_flight == 0:
            self._mark_busy()
        self.steps_in_flight += 1

    def step_finished(self) -> None:
        """A step's result was applied: progress (the timeout restarts for the steps still out)."""
        self.steps_in_flight = max(0, self.steps_in_flight - 1)
        self.steps_finished += 1
        if self.steps_in_flight:
            self._mark_busy()
        else:
            self.busy_since = self.busy_since_wall = None

    def _mark_busy(self) -> None:
        self.busy_since_wall = time.time()
        self.busy_since = time.monotonic()

    def publish(self, state_fn: Callable[[], dict], busy: bool) -> None:
        """Refresh the state snapshot: every SNAPSHOT_INTERVAL_S while busy, and whenever the
        scheduler turns busy or idle (so an idle server's snapshot is exact)."""
        now = time.monotonic()
        if busy != self._snapshot_busy or now - self._snapshot_mono >= SNAPSHOT_INTERVAL_S:
            self.snapshot = state_fn()
            self.snapshot_time = time.time()
            self._snapshot_mono = now
            self._snapshot_busy = busy

    # ------------------------------------------------------------------ the thread
    def start(
        self,
        heartbeat_sink: Optional[Callable[[], Callable[[Any], None]]] = None,
        on_timeout: Optional[Callable[[], None]] = None,
    ) -> None:
        """Start the thread (call from the scheduler loop's thread). `heartbeat_sink`: a factory,
        called in the thread, of the function that sends heartbeats (entry rank only).
        `on_timeout`: what to do after the timeout was logged (default: exit the process)."""
        if self._thread is not None:
            return
        self._loop_thread_id = threading.get_ident()
        self._on_timeout = on_timeout or _exit_process
        self._thread = threading.Thread(
            target=self._run, args=(heartbeat_sink,), name="scheduler-watchdog", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def heartbeat(self) -> SchedulerHeartbeat:
        return SchedulerHeartbeat(
            rank=self.rank,
            dp_rank=self.dp_rank,
            sent_time=time.time(),
            steps_finished=self.steps_finished,
            steps_in_flight=self.steps_in_flight,
            busy_since=self.busy_since_wall,
            state=self.snapshot,
            state_time=self.snapshot_time,
            watchdog_timeout=self.timeout_s,
        )

    def overdue_s(self) -> float:
        """How far past the timeout the current step is (<= 0: not overdue or no step running)."""
        since = self.busy_since
        return -1.0 if since is None else time.monotonic() - since - self.timeout_s

    def _run(self, heartbeat_sink: Optional[Callable[[], Callable[[Any], None]]]) -> None:
        send = None
        if heartbeat_sink is not None:
            try:
                send = heartbeat_sink()
            except Exception:  # noqa: BLE001 - the watchdog must run without heartbeats too
                logger.exception("watchdog: cannot send heartbeats")
        last_beat = 0.0
        poll = min(POLL_S, self.timeout_s / 4)
        while not self._stop.wait(poll):
            if self.overdue_s() > 0:
                self._fire()
                return
            now = time.monotonic()
            if send is not None and now - last_beat >= HEARTBEAT_INTERVAL_S:
                try:
                    send(self.heartbeat())
                except Exception:  # noqa: BLE001 - e.g. the tokenizer side is gone at shutdown
                    logger.debug("watchdog: heartbeat not sent", exc_info=True)
                last_beat = now

    def _fire(self) -> None:
        self.fired = True
        frame = sys._current_frames().get(self._loop_thread_id) if self._loop_thread_id else None
        where = "".join(traceback.format_stack(frame)) if frame is not None else "(stack unavailable)\n"
        logger.error(
            "watchdog timeout: a forward step has not finished in %.1f s (--watchdog-timeout %g; %d step(s) in "
            "flight, %d finished so far). The scheduler thread is here:\n%sThe server exits instead of hanging; "
            "raise --watchdog-timeout if such steps are expected.",
            time.monotonic() - (self.busy_since or time.monotonic()),
            self.timeout_s,
            self.steps_in_flight,
            self.steps_finished,
            where,
        )
        for handler in logging.getLogger().handlers:
            try:
                handler.flush()
            except Exception:  # noqa: BLE001
                pass
        self._on_timeout()


def _exit_process() -> None:
    """Leave now, from the watchdog thread (the loop thread is stuck and cannot unwind)."""
    sys.stderr.flush()
    os._exit(WATCHDOG_EXIT_CODE)
