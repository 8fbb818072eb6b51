"""Quadratic prefill-latency model and its least-squares fits (pure Python floats).

f(l) = a·l² + b·l + c is the latency of one prefill of l tokens (c: fixed per-forward cost).
A chunk of x tokens over a cached prefix of L tokens costs
    g(L, x) = f(L + x) − f(L) + c + e·L = a·(2Lx + x²) + b·x + c + e·L,
where e·L is the part of a chunk's cost that grows with the cached prefix but not with the chunk:
reading the prefix K/V once per forward (memory-bound; it dominates small chunks over long
prefixes). The start-up profile has no prefix, so it cannot see e (e = 0 there); the online fit
of auto mode learns it from chunks over growing prefixes.

All arithmetic is plain Python floats in a fixed order (IEEE-754 +, −, ×, ÷, √ are correctly
rounded), so every rank that fits the same numbers gets bit-identical coefficients, whatever
its BLAS or CPU. No numpy on purpose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence


class FitError(ValueError):
    """The data cannot give a usable model (too few points, singular, a <= 0, ...)."""


@dataclass(frozen=True)
class QuadraticLatencyModel:
    """f(l) = a·l² + b·l + c, plus e per cached prefix token per chunk; units of the latencies
    you fitted (seconds or ms)."""

    a: float
    b: float
    c: float = 0.0
    e: float = 0.0

    def cumulative(self, length: float) -> float:
        """f(l): latency of a single prefill of `length` tokens."""
        return (self.a * length + self.b) * length + self.c

    def chunk_latency(self, prefix_len: float, chunk_len: float) -> float:
        """g(L, x) = a·(2Lx + x²) + b·x + c + e·L: one chunk of x tokens over a prefix of L."""
        x = float(chunk_len)
        return self.a * (2.0 * prefix_len * x + x * x) + self.b * x + self.c + self.e * prefix_len

    def tokens_for_work(self, prefix_len: float, work: float) -> Optional[float]:
        """The x > 0 with a·x² + (2aL + b)·x = work (variable cost only); None if none exists."""
        if work <= 0.0:
            return None
        bb = 2.0 * self.a * prefix_len + self.b
        if self.a <= 0.0:
            return work / bb if bb > 0.0 else None
        disc = bb * bb + 4.0 * self.a * work
        if disc < 0.0:
            return None
        root = math.sqrt(disc)
        # Numerically stable form of (−B + √(B² + 4aW)) / 2a for B > 0.
        x = 2.0 * work / (bb + root) if bb > 0.0 else (root - bb) / (2.0 * self.a)
        return x if x > 0.0 else None

    def scaled(self, factor: float) -> "QuadraticLatencyModel":
        """Same shape, all latencies × factor (e.g. another GPU, or a stage of 1/pp layers)."""
        return QuadraticLatencyModel(self.a * factor, self.b * factor, self.c * factor, self.e * factor)

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "c": self.c, "e": self.e}

    @classmethod
    def from_dict(cls, data: dict) -> "QuadraticLatencyModel":
        return cls(float(data["a"]), float(data["b"]), float(data.get("c", 0.0)), float(data.get("e", 0.0)))


# ------------------------------------------------------------------ weighted least squares
def weighted_least_squares(
    rows: Sequence[Sequence[float]], ys: Sequence[float], weights: Optional[Sequence[float]] = None
) -> list[float]:
    """argmin_θ Σ wᵢ (rowsᵢ·θ − yᵢ)², columns equilibrated, Gaussian elimination with pivoting."""
    n = len(rows)
    if n == 0 or n != len(ys):
        raise FitError("least squares needs as many targets as rows (and at least one)")
    k = len(rows[0])
    w = [1.0] * n if weights is None else [float(v) for v in weights]
    scale = [max(abs(r[j]) for r in rows) or 1.0 for j in range(k)]
    ysc = max(abs(float(y)) for y in ys) or 1.0
    # Normal equations on scaled columns: (XᵀWX) θ' = XᵀWy.
    m = [[0.0] * (k + 1) for _ in range(k)]
    for r, y, wi in zip(rows, ys, w):
        if wi <= 0.0:
            continue
        u = [r[j] / scale[j] for j in range(k)]
        yy = float(y) / ysc
        for i in range(k):
            wu = wi * u[i]
            for j in range(k):
                m[i][j] += wu * u[j]
            m[i][k] += wu * yy
    norm = max(abs(m[i][i]) for i in range(k)) or 1.0
    for col in range(k):
        piv = max(range(col, k), key=lambda i: abs(m[i][col]))
        if abs(m[piv][col]) <= 1e-12 * norm:
            raise FitError("least squares is singular (data do not determine all coefficients)")
        m[col], m[piv] = m[piv], m[col]
        for i in range(col + 1, k):
            f = m[i][col] / m[col][col]
            for j in range(col, k + 1):
                m[i][j] -= f * m[col][j]
    theta = [0.0] * k
    for i in range(k - 1, -1, -1):
        acc = m[i][k] - sum(m[i][j] * theta[j] for j in range(i + 1, k))
        theta[i] = acc / m[i][i]
    return [theta[j] * ysc / scale[j] for j in range(k)]


def fit_cumulative(lengths: Sequence[float], latencies: Sequence[float]) -> QuadraticLatencyModel:
    """Plain least squares of latency on [l², l, 1] (upstream's start-up fit, no clamping)."""
    if len(lengths) != len(latencies):
        raise FitError(f"{len(lengths)} lengths but {len(latencies)} latencies")
    if len(set(lengths)) < 3:
        raise FitError("a quadratic needs at least 3 distinct lengths")
    rows = [(float(l) * float(l), float(l), 1.0) for l in lengths]
    a, b, c = weighted_least_squares(rows, latencies)
    return QuadraticLatencyModel(a, b, c)


@dataclass(frozen=True)
class ChunkSample:
    """One measured chunk: `chunk_len` tokens over `prefix_len` cached tokens took `latency`."""

    prefix_len: int
    chunk_len: int
    latency: float
    weight: float = 1.0


def chunk_features(prefix_len: float, chunk_len: float, prefix_term: bool = False) -> tuple[float, ...]:
    x = float(chunk_len)
    base = (2.0 * prefix_len * x + x * x, x, 1.0)
    return base + (float(prefix_len),) if prefix_term else base


def robust_fit_chunks(
    samples: Sequence[ChunkSample], iterations: int = 6, huber_k: float = 1.345, prefix_term: bool = False
) -> QuadraticLatencyModel:
    """Fit g(L, x) to chunk samples minimising *relative* error, with Huber IRLS against outliers.

    Weights are sample weight / ŷ² (ŷ: the previous pass's prediction, the measurement on the
    first pass) times a Huber factor on the relative residual rᵢ/ŷᵢ, whose scale is 1.4826 × the
    sample-weighted median |r/ŷ| (floor 1 %). So one slow chunk (a GC pause, a co-scheduled
    decode) cannot drag the fit, and forgotten (down-weighted) samples do not set the scale.
    Deterministic: a fixed number of passes, no randomness.

    prefix_term: also fit e (cost per cached prefix token per chunk). Needs samples that vary the
    prefix and the chunk independently; when they do not (singular), e is left at 0.
    """
    if prefix_term:
        try:
            return _robust_fit(samples, iterations, huber_k, True)
        except FitError:
            pass
    return _robust_fit(samples, iterations, huber_k, False)


def _robust_fit(
    samples: Sequence[ChunkSample], iterations: int, huber_k: float, prefix_term: bool
) -> QuadraticLatencyModel:
    pts = [s for s in samples if s.latency > 0.0 and s.weight > 0.0 and s.chunk_len > 0]
    if len(pts) < 3 + prefix_term:
        raise FitError("need at least 3 chunk samples with positive latency (4 with the prefix term)")
    rows = [chunk_features(s.prefix_len, s.chunk_len, prefix_term) for s in pts]
    k = len(rows[0])
    ys = [s.latency for s in pts]
    sw = [s.weight for s in pts]
    theta = weighted_least_squares(rows, ys, [w / (y * y) for w, y in zip(sw, ys)])
    for _ in range(iterations):
        pred = [max(sum(r[j] * theta[j] for j in range(k)), 0.1 * y) for r, y in zip(rows, ys)]
        rel = [(p - y) / p for p, y in zip(pred, ys)]
        scale = max(1.4826 * _weighted_median([abs(v) for v in rel], sw), 0.01)
        cut = huber_k * scale
        weights = [w / (p * p) * (1.0 if abs(v) <= cut else cut / abs(v)) for w, p, v in zip(sw, pred, rel)]
        theta = weighted_least_squares(rows, ys, weights)
    return QuadraticLatencyModel(*theta)


def _weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    pairs = sorted(zip(values, weights))
    half = 0.5 * sum(w for _, w in pairs)
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= half:
            return v
    return pairs[-1][0]
