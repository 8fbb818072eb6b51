"""Counters and a light trace of context-parallel gathers (tests and benchmarks; off by default).

A `CPProbe` is attached to a batch's layout (`CPLayout.probe`, from `CPRuntime.probe`, layers/cp_runtime.py); with none
attached (the default) the attention paths skip every call here. It records:

- the order of events per layer (`events`: (name, layer id)): `gather_start` when a layer's
  early exchange starts (the `[latent ; rope ; index key]` rows of MLA / DSA, the k/v of MHA),
  `gather_wait` when the layer waits on it, and whatever the caller marks itself (a test marks
  `q_proj` from a forward hook on the q projection): the overlap holds when, per layer,
  start < q_proj < wait. `lazy_starts` counts exchanges that nobody started early (started by
  the wait itself: no overlap); `async_starts` those started with an async handle in flight.
- the rows of every round of the cached-prefix gather (`rounds`: rows this rank received, the
  padded receive buffer's rows): `--cp-kv-gather-segment` caps the former.
"""

from __future__ import annotations

import time
from typing import Any


class CPProbe:
    def __init__(self) -> None:
        self.events: list[tuple[str, int, float]] = []  # (name, layer id, perf_counter seconds)
        self.lazy_starts = 0
        self.async_starts = 0  # exchanges started with an async handle in flight
        self.rounds: list[tuple[int, int]] = []  # per prefix-gather round: (rows, buffer rows)
        self.peak_buffer_bytes = 0  # the largest receive buffer of a prefix round

    def mark(self, name: str, layer_id: int) -> None:
        self.events.append((name, int(layer_id), time.perf_counter()))

    def started(self, layer_id: int, pending: Any, early: bool) -> None:
        """A layer's exchange started (`early`: by the early-exchange hook, before attention)."""
        self.mark("gather_start", layer_id)
        if not early:
            self.lazy_starts += 1
        if getattr(pending, "work", None) is not None:
            self.async_starts += 1
        pending.on_wait = lambda: self.mark("gather_wait", layer_id)

    def prefix_round(self, rows: int, buffer_rows: int, row_bytes: int = 0) -> None:
        self.rounds.append((int(rows), int(buffer_rows)))
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, int(buffer_rows) * int(row_bytes))

    # ------------------------------------------------------------------ read-outs
    @property
    def peak_round_rows(self) -> int:
        return max((r for r, _ in self.rounds), default=0)

    @property
    def peak_buffer_rows(self) -> int:
        return max((b for _, b in self.rounds), default=0)

    @property
    def prefix_rows(self) -> int:
        return sum(r for r, _ in self.rounds)

    def order(self, layer_id: int) -> list[str]:
        """Names of the events of one layer, in the order they happened."""
        return [name for name, layer, _ in self.events if layer == layer_id]

    def reset(self) -> None:
        self.events.clear()
        self.rounds.clear()
        self.lazy_starts = self.async_starts = self.peak_buffer_bytes = 0
