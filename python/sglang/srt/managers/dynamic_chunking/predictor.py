"""Upstream-compatible dynamic chunk sizes for chunked pipeline prefill.

Start-up: every PP stage times single-request prefills at `profile_lengths(...)`, the per-stage
lists are combined (`merge_stage_latencies`, identical on every rank once gathered) and `fit`
fits f(l) = a·l² + b·l + c. Then for a request whose first L tokens are already in the KV cache
the next chunk x makes f(L + x) − f(L) equal the target T = f(C) − f(0), i.e. every chunk costs
what the first full chunk of C tokens cost. See docs/dynamic_chunking.md.
"""

from __future__ import annotations

import logging
import math
from typing import Optional, Sequence

from sglang.srt import envs
from sglang.srt.managers.dynamic_chunking.latency_model import (
    FitError,
    QuadraticLatencyModel,
    fit_cumulative,
)

logger = logging.getLogger(__name__)

MIN_ALIGNMENT = 64
CONTEXT_MARGIN = 100  # tokens kept free below the context length, as upstream


def chunk_alignment(page_size: int) -> int:
    """Chunk sizes are multiples of max(page_size, 64)."""
    return max(int(page_size), MIN_ALIGNMENT)


def profile_lengths(chunk_size: int, tp_size: int = 1, page_size: int = 1, n: int = 128) -> list[int]:
    """Descending prefill lengths for start-up profiling, from ≤ 1.25·C down in equal steps.

    Every length and the step are multiples of lcm(tp_size, page_size) (upstream's step
    `1.25·C // 128` is not, which breaks e.g. C=3072 with TP 8). At most `n` lengths, all > 0,
    distinct. The first (longest) one doubles as the warm-up run that `fit` drops.
    """
    if chunk_size < 1 or tp_size < 1 or page_size < 1 or n < 1:
        raise ValueError("chunk_size, tp_size, page_size and n must be >= 1")
    unit = tp_size * page_size // math.gcd(tp_size, page_size)
    top = (chunk_size * 5 // 4) // unit * unit
    if top <= 0:
        return []
    step = max(unit, (top // n) // unit * unit)
    return [top - i * step for i in range(n) if top - i * step > 0]


def merge_stage_latencies(per_stage: Sequence[Sequence[float]]) -> list[float]:
    """Element-wise max over stages: a chunk's pipeline beat is set by the slowest stage.

    Feed it the lists gathered from every stage, in stage order; the result (and hence the fit)
    is the same on every rank.
    """
    if not per_stage:
        raise ValueError("no stage latencies")
    n = len(per_stage[0])
    if any(len(s) != n for s in per_stage):
        raise ValueError("every stage must time the same lengths")
    return [max(float(s[i]) for s in per_stage) for i in range(n)]


def check_smooth_factor(alpha: float) -> float:
    alpha = float(alpha)
    if not (0.0 <= alpha <= 1.0) or math.isnan(alpha):
        raise ValueError(f"SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR must be in [0, 1], got {alpha}")
    return alpha


class ChunkSizePredictor:
    """Upstream's dynamic chunk-size rule; without a valid fit it returns the fixed size C."""

    MIN_FIT_POINTS = 8

    def __init__(
        self,
        chunk_size: int,
        *,
        page_size: int = 1,
        smooth_factor: Optional[float] = None,
        max_prefill_tokens: Optional[int] = None,
        context_len: Optional[int] = None,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = int(chunk_size)
        self.page_size = int(page_size)
        self.alignment = chunk_alignment(page_size)
        alpha = envs.SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR.get() if smooth_factor is None else smooth_factor
        self.smooth_factor = check_smooth_factor(alpha)
        self.max_prefill_tokens = max_prefill_tokens
        self.context_len = context_len
        self.model: Optional[QuadraticLatencyModel] = None
        self.target: Optional[float] = None

    # -------------------------------------------------------------- fitting
    @property
    def is_fitted(self) -> bool:
        return self.model is not None

    def fit(self, lengths: Sequence[int], latencies: Sequence[float], *, warmup: int = 1) -> bool:
        """Fit from profiling; drop the first `warmup` samples (cold). False → fixed chunks."""
        if len(lengths) != len(latencies):
            raise ValueError(f"{len(lengths)} lengths but {len(latencies)} latencies")
        xs, ys = list(lengths)[warmup:], list(latencies)[warmup:]
        if len(xs) < self.MIN_FIT_POINTS:
            return self._reject(f"only {len(xs)} profiling points after warm-up (need {self.MIN_FIT_POINTS})")
        try:
            model = fit_cumulative(xs, ys)
        except FitError as exc:
            return self._reject(str(exc))
        return self.set_model(model)

    def set_model(self, model: QuadraticLatencyModel) -> bool:
        """Install coefficients (fitted elsewhere or typed in): a > 0 required, b < 0 → 0."""
        if not (model.a > 0.0) or not all(math.isfinite(v) for v in (model.a, model.b, model.c)):
            return self._reject(f"fitted quadratic has a = {model.a:.3g} (need a > 0)")
        if model.b < 0.0:
            model = QuadraticLatencyModel(model.a, 0.0, model.c)
        target = model.cumulative(self.chunk_size) - model.cumulative(0)
        if not target > 0.0:
            return self._reject(f"target chunk time {target:.3g} is not positive")
        self.model, self.target = model, target
        return True

    def observe(self, prefix_len: int, chunk_len: int, latency_s: float) -> None:
        """Upstream's rule is fitted once at start-up: a measured chunk changes nothing (no-op;
        the `ChunkPlanner` protocol's online hook, which `AutoChunkPlanner` uses)."""

    def _reject(self, why: str) -> bool:
        logger.warning("dynamic chunking: %s; falling back to fixed chunks of %d", why, self.chunk_size)
        self.model, self.target = None, None
        return False

    # -------------------------------------------------------------- prediction
    def predict(self, prefix_len: int) -> Optional[int]:
        """Upstream semantics: the dynamic size, or None meaning "use C"."""
        if self.model is None or self.target is None or self.smooth_factor == 0.0:
            return None
        x = self.model.tokens_for_work(prefix_len, self.target)
        if x is None:
            return None
        c, a_ = self.chunk_size, self.alignment
        s = max(int(c + self.smooth_factor * (x - c)), c // 4)
        s = max(a_, s // a_ * a_)
        caps = [s]
        if self.context_len is not None:
            caps.append(self.context_len - prefix_len - CONTEXT_MARGIN)
        if self.max_prefill_tokens is not None:
            caps.append(self.max_prefill_tokens)
        s = min(caps) // a_ * a_
        return s if s >= a_ else None

    def next_chunk_size(self, prefix_len: int) -> int:
        """Token budget for the next chunk of a request with `prefix_len` tokens cached."""
        s = self.predict(prefix_len)
        return self.chunk_size if s is None else s

    def chunk_budget(self, prompt_len: int, prefix_len: int, pp_size: int) -> int:
        """Mode-independent entry point (same signature as `AutoChunkPlanner.chunk_budget`)."""
        del prompt_len, pp_size  # upstream's rule depends on the prefix only
        return self.next_chunk_size(prefix_len)

    def plan_chunks(self, prompt_len: int, prefix_len: int = 0) -> list[int]:
        """Chunks the scheduler will run for a prompt of `prompt_len` tokens (first `prefix_len`
        cached): each is min(next_chunk_size(L), tokens left), tiny tails included."""
        if prompt_len < prefix_len:
            raise ValueError(f"prompt_len {prompt_len} < prefix_len {prefix_len}")
        chunks: list[int] = []
        done = prefix_len
        while done < prompt_len:
            x = min(self.next_chunk_size(done), prompt_len - done)
            chunks.append(x)
            done += x
        return chunks

    def to_dict(self) -> dict:
        """Everything that decides a chunk size (for broadcasting / logging)."""
        return {
            "chunk_size": self.chunk_size,
            "page_size": self.page_size,
            "smooth_factor": self.smooth_factor,
            "max_prefill_tokens": self.max_prefill_tokens,
            "context_len": self.context_len,
            "model": None if self.model is None else self.model.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "ChunkSizePredictor":
        p = cls(
            data["chunk_size"],
            page_size=data["page_size"],
            smooth_factor=data["smooth_factor"],
            max_prefill_tokens=data["max_prefill_tokens"],
            context_len=data["context_len"],
        )
        if data.get("model") is not None:
            p.set_model(QuadraticLatencyModel.from_dict(data["model"]))
        return p
