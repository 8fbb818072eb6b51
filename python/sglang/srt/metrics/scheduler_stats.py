"""Scheduler-side statistics kept as plain numbers, read by `/metrics` through
`Scheduler.internal_state()` at scrape time (cumulative, so a scrape that reads a heartbeat's
snapshot or misses one loses nothing):

- `DecodeThroughput`: decode tokens per second over the last `window` forward steps that decoded
  (upstream's `sglang:gen_throughput`; it keeps its last value while the server idles);
- `BucketCounts`: a histogram's cumulative bucket counts, sum and count (upstream's
  `sglang:queue_time_seconds`: arrival to first admission into a batch).
"""

from __future__ import annotations

from collections import deque

QUEUE_TIME_BUCKETS = (
    0.0,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    3.0,
    4.0,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    70.0,
    80.0,
    90.0,
    100.0,
    200.0,
    300.0,
    400.0,
    500.0,
    600.0,
    700.0,
    800.0,
    900.0,
    1000.0,
    1200.0,
    1400.0,
    1600.0,
    1800.0,
    2000.0,
    2500.0,
    3000.0,
)
DECODE_WINDOW_STEPS = 40  # upstream's --decode-log-interval default


class DecodeThroughput:
    """Decode tokens / s over the last `window` forward steps that decoded: each step's time runs
    from its launch to its result (steps launched back to back overlap under pipeline parallelism,
    which makes this a lower bound there)."""

    def __init__(self, window: int = DECODE_WINDOW_STEPS):
        self.steps: deque = deque(maxlen=window)  # (seconds, decode tokens)
        self.launched: deque = deque()  # launch times of the steps whose result is pending

    def launch(self, now: float) -> None:
        self.launched.append(now)

    def finish(self, now: float, decode_tokens: int) -> None:
        """The oldest launched step's result arrived at `now`; it decoded `decode_tokens` tokens."""
        start = self.launched.popleft() if self.launched else now
        if decode_tokens > 0:
            self.steps.append((max(now - start, 0.0), decode_tokens))

    @property
    def value(self) -> float:
        seconds = sum(s for s, _ in self.steps)
        return sum(n for _, n in self.steps) / seconds if seconds > 0 else 0.0


class BucketCounts:
    """Cumulative histogram state: `counts[i]` observations <= `buckets[i]` (the last bucket is +Inf)."""

    def __init__(self, buckets: tuple[float, ...] = QUEUE_TIME_BUCKETS):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        value = max(value, 0.0)
        for i, upper in enumerate(self.buckets):
            if value <= upper:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> dict:
        """Per-bucket (not cumulative) counts, sum and count: a plain dict for internal_state."""
        return {
            "buckets": list(self.buckets),
            "counts": list(self.counts),
            "sum": self.sum,
            "count": self.count,
        }
