"""Measure on this machine through `sgl.Engine`: per-chunk latencies and TTFTs.

Chunk (L, x): flush the cache, prefill the first L tokens (cached by the radix tree), then time a
prefill of the L + x tokens, which computes only the x new ones. The wall time includes the
request's IPC (a few ms), which the fit folds into the fixed per-forward cost c.
TTFT: flush the cache, time a one-token generation of a fresh random prompt.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any, Sequence

from sglang.srt.tools.pp_sim_trace import Measurement


def default_points(max_chunk: int, max_prefix: int, steps: int = 4) -> list[tuple[int, int]]:
    """A (prefix, chunk) grid: chunks max_chunk/steps .. max_chunk, prefixes 0 .. max_prefix."""
    chunks = sorted({max(1, max_chunk * (i + 1) // steps) for i in range(steps)})
    prefixes = sorted({max_prefix * i // steps for i in range(steps + 1)})
    return [(p, x) for p in prefixes for x in chunks]


def _ids(rng: random.Random, n: int, vocab_max: int) -> list[int]:
    return [rng.randrange(10, vocab_max) for _ in range(n)]


def _prefill(engine: Any, ids: list[int]) -> float:
    start = time.perf_counter()
    engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0, "temperature": 0})
    return time.perf_counter() - start


def _summary(times: list[float], stat: str) -> float:
    if stat == "min":
        return min(times)
    if stat == "median":
        return statistics.median(times)
    raise ValueError(f"stat must be 'min' or 'median', got {stat!r}")


def measure_chunk_latencies(
    engine: Any,
    points: Sequence[tuple[int, int]],
    repeats: int = 3,
    vocab_max: int = 10000,
    seed: int = 0,
    stat: str = "median",
) -> list[Measurement]:
    """`stat` of `repeats` timings per (prefix_len, chunk_len) point, after one warm-up.

    Each repeat visits every point in a fresh shuffled order, so a burst of load from other
    processes spreads over points instead of spoiling one group of them.
    """
    rng = random.Random(seed)
    _prefill(engine, _ids(rng, max(x for _, x in points), vocab_max))  # warm-up
    times: dict[int, list[float]] = {i: [] for i in range(len(points))}
    for _ in range(repeats):
        order = list(range(len(points)))
        rng.shuffle(order)
        for i in order:
            prefix, chunk = points[i]
            ids = _ids(rng, prefix + chunk, vocab_max)
            engine.flush_cache()
            if prefix:
                _prefill(engine, ids[:prefix])
            times[i].append(_prefill(engine, ids))
    return [Measurement(p, x, _summary(times[i], stat)) for i, (p, x) in enumerate(points)]


def measure_ttft(
    engine: Any,
    prompt_lens: Sequence[int],
    repeats: int = 3,
    vocab_max: int = 10000,
    seed: int = 1,
    stat: str = "median",
) -> list[tuple[int, float]]:
    """`stat` of the TTFTs (one new token, cache flushed) per prompt length, interleaved."""
    rng = random.Random(seed)
    times: dict[int, list[float]] = {n: [] for n in prompt_lens}
    for _ in range(repeats):
        for n in prompt_lens:
            ids = _ids(rng, n, vocab_max)
            engine.flush_cache()
            start = time.perf_counter()
            engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0})
            times[n].append(time.perf_counter() - start)
    return [(n, _summary(times[n], stat)) for n in prompt_lens]
