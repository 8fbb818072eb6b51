"""Timing the start-up profiling prefills on one stage (the model call is the caller's)."""

from __future__ import annotations

import time
from typing import Callable, Sequence


def time_prefills(
    run_prefill: Callable[[int], None],
    lengths: Sequence[int],
    synchronize: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Seconds per `run_prefill(length)`, measured between device synchronizations.

    `run_prefill` runs one single-request EXTEND of `length` tokens through this stage's layers
    (zero proxy tensors on later stages) and frees its KV slots; `synchronize` is e.g.
    `torch.cuda.synchronize`. Gather the lists of all stages and `merge_stage_latencies` them.
    """
    out = []
    for length in lengths:
        synchronize()
        start = clock()
        run_prefill(int(length))
        synchronize()
        out.append(clock() - start)
    return out
