"""Timing of one prompt's chunks flowing through a pipeline of stages (pure, deterministic).

Chunk k runs on stage s after it left stage s−1 and the hop to s arrived (`hop_times[k]`), and
after stage s finished chunk k−1 (stages run chunks in order). The micro-batch ring has
`ring_slots` slots (pp_size + pp_async_batch_depth): chunk k may only enter stage 0 once the
output of chunk k − ring_slots came back from the last stage (`return_time` later), because its
slot is reused. This is the engine's ring, not an idealised pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class TransferModel:
    """P2P cost of one stage hop: fixed_s + per_token_s · chunk tokens (hidden + residual)."""

    fixed_s: float = 0.0
    per_token_s: float = 0.0

    def hop(self, chunk_len: int) -> float:
        return self.fixed_s + self.per_token_s * chunk_len


@dataclass(frozen=True)
class PipelineTimeline:
    """start[k][s] / end[k][s]: when chunk k ran on stage s (seconds from the prompt's arrival)."""

    start: list[list[float]]
    end: list[list[float]]

    @property
    def makespan(self) -> float:
        return self.end[-1][-1] if self.end else 0.0

    @property
    def num_stages(self) -> int:
        return len(self.end[0]) if self.end else 0

    def busy(self, stage: int) -> float:
        return sum(e[stage] - s[stage] for s, e in zip(self.start, self.end))


def run_pipeline(
    stage_times: Sequence[Sequence[float]],
    hop_times: Optional[Sequence[float]] = None,
    ring_slots: Optional[int] = None,
    return_time: float = 0.0,
) -> PipelineTimeline:
    """Event recurrence over chunks × stages; `stage_times[k][s]` is chunk k's time on stage s."""
    k_n = len(stage_times)
    if k_n == 0:
        return PipelineTimeline([], [])
    p_n = len(stage_times[0])
    hops = [0.0] * k_n if hop_times is None else [float(h) for h in hop_times]
    start = [[0.0] * p_n for _ in range(k_n)]
    end = [[0.0] * p_n for _ in range(k_n)]
    for k in range(k_n):
        row = stage_times[k]
        for s in range(p_n):
            if s == 0:
                ready = 0.0
                if ring_slots is not None and k >= ring_slots:
                    ready = end[k - ring_slots][p_n - 1] + return_time
            else:
                ready = end[k][s - 1] + hops[k]
            if k > 0 and end[k - 1][s] > ready:
                ready = end[k - 1][s]
            start[k][s] = ready
            end[k][s] = ready + float(row[s])
    return PipelineTimeline(start, end)


def uniform_makespan(
    chunk_times: Sequence[float],
    pp_size: int,
    hop_times: Optional[Sequence[float]] = None,
    ring_slots: Optional[int] = None,
    return_time: float = 0.0,
) -> float:
    """Makespan when every stage takes the same time per chunk (O(K·P), no timeline kept).

    Without the ring constraint this equals Σ t_k + (P−1)·max_k (t_k + d_k) (proportionate
    flow shop); tests check the two agree.
    """
    k_n = len(chunk_times)
    if k_n == 0:
        return 0.0
    hops = [0.0] * k_n if hop_times is None else hop_times
    prev = [0.0] * pp_size  # end times of the previous chunk per stage
    last_ends: list[float] = []
    for k in range(k_n):
        t, d = float(chunk_times[k]), float(hops[k])
        ready = 0.0
        if ring_slots is not None and k >= ring_slots:
            ready = last_ends[k - ring_slots] + return_time
        cur = [0.0] * pp_size
        for s in range(pp_size):
            if s > 0:
                ready = cur[s - 1] + d
            if prev[s] > ready:
                ready = prev[s]
            cur[s] = ready + t
        last_ends.append(cur[-1])
        prev = cur
    return prev[-1]
