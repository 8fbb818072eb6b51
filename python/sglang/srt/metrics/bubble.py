"""Pipeline bubble ratio of one stage: the share of wall time the stage waited instead of computing.

The PP event loop calls `busy(seconds)` after each forward it ran and `idle(seconds)` after each
wait for proxies or outputs; `ratio()` is idle / (idle + busy) over the last `window_s` seconds.
Stage k's ratio travels to stage 0 inside the micro-batch messages and the outputs; stage 0's
`PPDriver` (managers/pp/driver.py) keeps one ratio per stage (index = pp rank) and hands them to
its `Scheduler` as extra internal state, so `internal_state()["pp_bubble_ratio"]` reports them and
`/metrics` exports them as `sglang:pp_bubble_ratio{pp_stage="k"}`.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Optional

DEFAULT_WINDOW_S = 10.0


class BubbleMeter:
    """Sliding-window idle/busy accounting (not thread-safe: one event loop owns it)."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, clock: Callable[[], float] = time.monotonic):
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self.clock = clock
        self._events: deque[tuple[float, float, float]] = deque()  # (time, busy_s, idle_s)
        self._busy = 0.0
        self._idle = 0.0

    def busy(self, seconds: float) -> None:
        self._add(max(seconds, 0.0), 0.0)

    def idle(self, seconds: float) -> None:
        self._add(0.0, max(seconds, 0.0))

    def _add(self, busy: float, idle: float) -> None:
        self._events.append((self.clock(), busy, idle))
        self._busy += busy
        self._idle += idle
        self._expire()

    def _expire(self) -> None:
        horizon = self.clock() - self.window_s
        while self._events and self._events[0][0] < horizon:
            _, busy, idle = self._events.popleft()
            self._busy -= busy
            self._idle -= idle

    def ratio(self) -> Optional[float]:
        """idle / (idle + busy) over the window; None when nothing was recorded in it."""
        self._expire()
        total = self._busy + self._idle
        if total <= 0 or not self._events:
            return None
        return min(max(self._idle / total, 0.0), 1.0)
