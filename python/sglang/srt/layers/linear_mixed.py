"""float32 model, bf16 weight copies for single-token GEMMs: the linear of `--dtype auto` on CPUs
without native bf16 (AVX2, generic x86-64).

There, bf16 GEMMs have no native instructions: torch / oneDNN convert in slow fallback paths that
make a prefill chunk 6-9x slower than float32 (docs/benchmarks.md, "--dtype auto on CPUs without
native bf16"), and the fallback reads the weight once per input row, so bf16 loses to float32 from
two rows on. Only a single-row GEMM (one sequence decoding: memory-bound, where bf16 halves the
bytes read per token) is faster in bf16. So the model runs in float32 (weights, KV cache,
activations, attention) and each linear keeps, next to its float32 weight, a bf16 copy (half the
bytes again, while memory allows): inputs of at most `max_tokens` rows go through the bf16 copy
(input rounded to bf16, result back to float32), larger ones through the float32 weight.

Plugged in through the packed-linear hook (`Platform.prepacked_linear`, layers/linear_prepack.py):
the CPU platform returns this backend when `--dtype auto` chose this mode (platforms/cpu.py).
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)


@dataclass
class MixedWeight:
    """A linear's float32 weight and, where memory allowed, its bf16 copy."""

    float32: torch.Tensor
    bf16: Optional[torch.Tensor]
    max_tokens: int


class _CopyBudget:
    """Bytes of bf16 copies still allowed in this process (set by the first `mixed_linear_backend`
    call: the platform gives a quarter of the RAM free then); past it, the remaining linears run
    in float32 only (logged once)."""

    def __init__(self) -> None:
        self.left: Optional[int] = None
        self.kept = self.skipped = 0
        self.kept_bytes = 0
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        with self.lock:
            if self.left is None or nbytes <= self.left:
                if self.left is not None:
                    self.left -= nbytes
                self.kept += 1
                self.kept_bytes += nbytes
                return True
            if not self.skipped:
                logger.warning(
                    "float32 linears: no memory left for more bf16 weight copies (%.0f MiB kept); "
                    "the other linears decode in float32",
                    self.kept_bytes / 2**20,
                )
            self.skipped += 1
            return False


_budget = _CopyBudget()


def pack(weight: torch.Tensor, max_tokens: int) -> MixedWeight:
    weight = weight.detach()
    copy = weight.to(torch.bfloat16).contiguous() if _budget.take(weight.numel() * 2) else None
    return MixedWeight(weight, copy, max_tokens)


def mixed_linear(x: torch.Tensor, w: MixedWeight, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x [tokens, in] float32 -> [tokens, out] float32; through the bf16 copy for at most
    `w.max_tokens` tokens."""
    if w.bf16 is None or x.shape[0] > w.max_tokens:
        return F.linear(x, w.float32, bias)
    out = F.linear(x.to(torch.bfloat16), w.bf16).float()
    return out if bias is None else out + bias


_backends: dict[int, tuple[Callable, Callable]] = {}


def mixed_linear_backend(max_tokens: int, copy_budget_bytes: Optional[int] = None) -> tuple[Callable, Callable]:
    """(pack, kernel) for layers/linear_prepack.py; the first call sets the bytes the bf16 copies
    may take in this process (None: no limit)."""
    with _budget.lock:
        if max_tokens in _backends:
            return _backends[max_tokens]
        if not _backends:
            _budget.left = copy_budget_bytes
        _backends[max_tokens] = functools.partial(pack, max_tokens=max_tokens), mixed_linear
    logger.info(
        "float32 linears with bf16 weight copies (half the float32 weight bytes more, while a quarter "
        "of free RAM allows) for inputs of at most %d token(s)",
        max_tokens,
    )
    return _backends[max_tokens]


def copies_kept() -> tuple[int, int, int]:
    """(linears with a bf16 copy, their bytes, linears without one) packed in this process so far."""
    return _budget.kept, _budget.kept_bytes, _budget.skipped
