"""`--dynamic-chunking-mode auto`: chunk plans that minimise predicted TTFT, no hand tuning.

The per-stage chunk latency g(L, x) = a·(2Lx + x²) + b·x + c + e·L is refitted online from measured
chunks (relative-error Huber IRLS, exponential forgetting, a prior from start-up profiling as
regulariser). For a prompt it scores candidate plans by their pipeline makespan (pp stages, ring of
pp + async-depth slots, p2p hops) and keeps the smallest: equal-time plans (for a time budget T
from K chunks, each chunk as large as fits T), uniform plans (C, the body floor and its doublings,
the cap). All are aligned to max(page_size, 64), with no tail below C // 4 (merged into the
previous chunk). Since every uniform size is a candidate, auto is never predicted worse than any
fixed chunk of those sizes, C included.
Deterministic: same observations in the same order → same plans on every rank.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from typing import Optional, Sequence

from sglang.srt.managers.dynamic_chunking.latency_model import (
    ChunkSample,
    FitError,
    QuadraticLatencyModel,
    fit_cumulative,
    robust_fit_chunks,
)
from sglang.srt.managers.dynamic_chunking.pipeline import TransferModel, uniform_makespan
from sglang.srt.managers.dynamic_chunking.predictor import chunk_alignment

logger = logging.getLogger(__name__)


class AutoChunkPlanner:
    """Online-fitted latency model + TTFT-minimising chunk plans.

    chunk_size: C (tails never below C // 4). max_chunk_size: largest chunk (default C; the
    engine passes max(C, --max-prefill-tokens)). forgetting: weight λ per newer observation.
    transfer / async_depth: p2p hop cost and pp_async_batch_depth for the ring model.
    min_alignment: chunk sizes are also multiples of this (the platform's attention tile).
    min_chunk: no chunk but the last is smaller (the platform's smallest efficient chunk).
    """

    def __init__(
        self,
        chunk_size: int,
        *,
        page_size: int = 1,
        max_chunk_size: Optional[int] = None,
        prior: Optional[QuadraticLatencyModel] = None,
        forgetting: float = 0.98,
        window: int = 256,
        min_observations: int = 8,
        prior_weight: float = 0.25,
        transfer: TransferModel = TransferModel(),
        async_depth: int = 0,
        min_alignment: int = 1,
        min_chunk: int = 1,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        if not 0.0 < forgetting <= 1.0:
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting}")
        self.chunk_size = int(chunk_size)
        # Chunk sizes (and so the prefixes after them) are multiples of the page / 64 and of the
        # platform's attention tile (`Platform.prefill_chunk_alignment`; 512 on CPU).
        self.alignment = math.lcm(chunk_alignment(page_size), max(1, int(min_alignment)))
        a_ = self.alignment
        self.tail_floor = max(1, self.chunk_size // 4)
        self.body_floor = max(a_, -(-max(self.tail_floor, int(min_chunk)) // a_) * a_)
        cap = self.chunk_size if max_chunk_size is None else int(max_chunk_size)
        self.cap = max(cap // a_ * a_, 2 * self.body_floor)
        self.forgetting = float(forgetting)
        self.min_observations = int(min_observations)
        self.prior_weight = float(prior_weight)
        self.transfer = transfer
        self.async_depth = int(async_depth)
        self._obs: deque[tuple[int, int, float]] = deque(maxlen=int(window))
        self._prior = self._sanitize(prior) if prior is not None else None
        self._model: Optional[QuadraticLatencyModel] = self._prior
        self._dirty = False
        # (prompt_len, pp_size, prefix_len) -> chunk size, the steps of plans being followed
        self._plan_steps: OrderedDict[tuple[int, int, int], int] = OrderedDict()
        self._max_plan_steps = 4096

    # -------------------------------------------------------------- the latency model
    def seed_profile(self, lengths: Sequence[int], latencies: Sequence[float], *, warmup: int = 1) -> bool:
        """Prior from start-up profiling (single prefills of `lengths`, latencies in seconds)."""
        try:
            model = fit_cumulative(list(lengths)[warmup:], list(latencies)[warmup:])
        except FitError as exc:
            logger.warning("dynamic chunking (auto): profile fit failed (%s); waiting for observations", exc)
            return False
        return self.set_prior(model)

    def fit(self, lengths: Sequence[int], latencies: Sequence[float], *, warmup: int = 1) -> bool:
        """Same call as `ChunkSizePredictor.fit`: the profile becomes the prior."""
        return self.seed_profile(lengths, latencies, warmup=warmup)

    def set_prior(self, model: QuadraticLatencyModel) -> bool:
        sane = self._sanitize(model)
        if sane is None:
            logger.warning("dynamic chunking (auto): prior has a = %.3g <= 0; ignored", model.a)
            return False
        self._prior = sane
        self._dirty = True
        return True

    def observe(self, prefix_len: int, chunk_len: int, latency_s: float) -> None:
        """One measured chunk stage latency. Feed only values every rank shares (e.g. the max
        over stages carried round the ring), in the same order on every rank."""
        if chunk_len <= 0 or not (latency_s > 0.0) or not math.isfinite(latency_s):
            return
        self._obs.append((int(prefix_len), int(chunk_len), float(latency_s)))
        self._dirty = True

    @property
    def num_observations(self) -> int:
        return len(self._obs)

    @property
    def model(self) -> Optional[QuadraticLatencyModel]:
        """Current per-stage model (refitted lazily); None until a prior or enough data."""
        if self._dirty:
            self._dirty = False
            fitted = self._refit()
            if fitted is not None:
                self._model = fitted
            elif self._model is None:
                self._model = self._prior
        return self._model

    def _refit(self) -> Optional[QuadraticLatencyModel]:
        n = len(self._obs)
        if n < self.min_observations and self._prior is None:
            return None
        if n == 0:
            return self._prior
        samples = [
            ChunkSample(p, x, t, self.forgetting ** (n - 1 - i)) for i, (p, x, t) in enumerate(self._obs)
        ]
        if self._prior is not None:
            c = self.chunk_size
            for prefix in (0, c, 4 * c, 16 * c):
                for x in (max(1, c // 4), max(1, c // 2), c):
                    samples.append(
                        ChunkSample(prefix, x, self._prior.chunk_latency(prefix, x), self.prior_weight)
                    )
        try:
            return self._sanitize(robust_fit_chunks(samples, prefix_term=True))
        except FitError:
            return None

    @staticmethod
    def _sanitize(model: QuadraticLatencyModel) -> Optional[QuadraticLatencyModel]:
        if not (model.a > 0.0) or not all(math.isfinite(v) for v in (model.a, model.b, model.c, model.e)):
            return None
        return QuadraticLatencyModel(model.a, max(model.b, 0.0), max(model.c, 0.0), max(model.e, 0.0))

    # -------------------------------------------------------------- planning
    def predict_ttft(self, chunks: Sequence[int], pp_size: int, prefix_len: int = 0) -> float:
        """Predicted prefill makespan of `chunks` on `pp_size` identical stages (seconds)."""
        model = self.model
        if model is None:
            raise RuntimeError("no latency model yet")
        times, hops, done = [], [], prefix_len
        for x in chunks:
            times.append(model.chunk_latency(done, x))
            hops.append(self.transfer.hop(x))
            done += x
        return uniform_makespan(
            times, pp_size, hops, ring_slots=pp_size + self.async_depth, return_time=self.transfer.fixed_s
        )

    def plan_chunks(self, prompt_len: int, pp_size: int, prefix_len: int = 0) -> list[int]:
        """Chunk sizes for the uncached part of a prompt; all but the last are multiples of the
        alignment in [body_floor, cap]; the last is in [min(C // 4, tokens), cap]."""
        if pp_size < 1:
            raise ValueError(f"pp_size must be >= 1, got {pp_size}")
        n = prompt_len - prefix_len
        if n < 0:
            raise ValueError(f"prompt_len {prompt_len} < prefix_len {prefix_len}")
        if n == 0:
            return []
        model = self.model
        fixed = self._greedy(n, lambda _done: self.chunk_size)
        if model is None:
            return fixed
        candidates = [fixed, self._greedy(n, lambda _done: self.cap)]
        # Uniform plans (a built-in sweep of fixed sizes, judged by the model): body floor, ×2, …
        size = self.body_floor
        while size < self.cap:
            candidates.append(self._greedy(n, lambda _done, size=size: size))
            size *= 2
        # Equal-time plans: every chunk as large as fits a time budget T (greedy: for a given T
        # this needs the fewest chunks, so the least fixed and prefix-read cost). T from K chunks:
        # the variable cost over K plus a chunk's fixed cost at the mean prefix.
        variable = model.chunk_latency(prefix_len, n) - model.c - model.e * prefix_len
        per_chunk = model.c + model.e * (prefix_len + 0.5 * n)
        for k in self._candidate_counts(n, pp_size, variable, per_chunk):
            target = variable / k + per_chunk

            def size_for(done: int, target: float = target) -> int:
                x = model.tokens_for_work(done, target - model.c - model.e * done)
                return self.body_floor if x is None else int(round(x / self.alignment)) * self.alignment

            candidates.append(self._greedy(n, size_for, prefix_len))
        best, best_key = fixed, None
        for plan in candidates:
            key = (self.predict_ttft(plan, pp_size, prefix_len), len(plan))
            if best_key is None or key < best_key:
                best, best_key = plan, key
        return best

    def next_chunk_size(self, prompt_len: int, prefix_len: int, pp_size: int) -> int:
        """Budget for the next chunk of a prompt.

        A prompt follows the plan made at its first chunk: re-planning the rest at every chunk
        would treat the pipeline as empty (its earlier chunks are still in flight) and, with the
        model refitted between chunks, mix pieces of different plans (slower: docs/notes/2026-11-dynamic-chunking.md).
        A fresh plan is made when `prefix_len` is not a boundary of a kept plan (a radix hit, or
        the adder cut a chunk short). Same calls in the same order → same plans on every rank.
        """
        key = (prompt_len, pp_size, prefix_len)
        size = self._plan_steps.get(key)  # get, not pop: asking twice in a pass gives the same size
        if size is None:
            plan = self.plan_chunks(prompt_len, pp_size, prefix_len)
            if not plan:
                return 0
            done = prefix_len
            for x in plan:
                self._plan_steps[(prompt_len, pp_size, done)] = x
                self._plan_steps.move_to_end((prompt_len, pp_size, done))
                done += x
            while len(self._plan_steps) > self._max_plan_steps:
                self._plan_steps.popitem(last=False)  # oldest first: plans of finished prompts
            size = self._plan_steps[key]
        return size

    def chunk_budget(self, prompt_len: int, prefix_len: int, pp_size: int) -> int:
        """Mode-independent entry point (same signature as `ChunkSizePredictor.chunk_budget`)."""
        return self.next_chunk_size(prompt_len, prefix_len, pp_size)

    def _candidate_counts(self, n: int, pp_size: int, variable: float, fixed_cost: float) -> list[int]:
        k_lo = max(1, -(-n // self.cap))
        k_hi = max(k_lo, n // self.body_floor)
        if fixed_cost > 0.0 and pp_size > 1:
            k_star = math.sqrt((pp_size - 1) * variable / fixed_cost)
        else:
            k_star = float(k_lo if pp_size == 1 else k_hi)
        ks = {k_lo, k_hi}
        for r in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.4, 1.6, 1.8, 2.0):
            ks.add(int(round(k_star * r)))
        base = int(k_star)
        ks.update(range(base - 2, base + 4))
        return sorted(k for k in ks if k_lo <= k <= k_hi)

    def _greedy(self, n: int, size, prefix_len: int = 0) -> list[int]:
        """Cut n tokens with `size(done)` proposals, clamped/aligned; no tail below C // 4."""
        chunks: list[int] = []
        done = 0
        while done < n:
            rem = n - done
            x = min(
                max(int(size(prefix_len + done)) // self.alignment * self.alignment, self.body_floor),
                self.cap,
            )
            if x >= rem:
                x = rem
            elif rem - x < self.tail_floor:
                # Would leave a tiny tail: merge it or, over the cap, leave a tail just >= C // 4.
                x = rem if rem <= self.cap else (rem - self.tail_floor) // self.alignment * self.alignment
            chunks.append(x)
            done += x
        return chunks
