"""Linears that mix bf16 and float32 by input size, for `--dtype auto` on CPU (platforms/cpu.py).

1. float32 model, bf16 weight copies for single-token GEMMs (`mixed_linear`): CPUs without native
bf16 (AVX-512 without BF16, AVX2, generic x86-64).
2. bf16 model, float32 weight copies for prefill-sized GEMMs (`float32_prefill_linear`): AVX512-BF16
CPUs without AMX (the end of this file).

(1)
There, bf16 GEMMs have no native instructions: torch / oneDNN convert in slow fallback paths that
make a prefill chunk 6-9x slower than float32 (docs/benchmarks.md, "--dtype auto on CPUs without
native bf16"), and the fallback reads the weight once per input row, so bf16 loses to float32 from
two rows on. Only a single-row GEMM (one sequence decoding: memory-bound, where bf16 halves the
bytes read per token) is faster in bf16. So the model runs in float32 (weights, KV cache,
activations, attention) and each linear keeps, next to its float32 weight, a bf16 copy (half the
bytes again, while memory allows): inputs of at most `max_tokens` rows go through the bf16 copy
(input rounded to bf16, result back to float32), larger ones through the float32 weight.

Plugged in through the packed-linear hook (`Platform.prepacked_linear`, layers/linear_prepack.py):
the CPU platform that made the `--dtype auto` choice holds a `MixedLinears` (the end of this file):
the backends of its mode and the one copy budget they share. Nothing here is process state.
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


class CopyBudget:
    """Bytes of weight copies still allowed (None: no limit; the CPU platform gives a quarter of
    the RAM free when the first linear is packed); past it, the remaining linears run in the model
    dtype only (logged once)."""

    def __init__(self, left: Optional[int] = None) -> None:
        self.left = left
        self.kept = self.skipped = 0
        self.kept_bytes = 0
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        """Whether a copy of `nbytes` fits (and count it)."""
        with self.lock:
            if self.left is None or nbytes <= self.left:
                if self.left is not None:
                    self.left -= nbytes
                self.kept += 1
                self.kept_bytes += nbytes
                return True
            if not self.skipped:
                logger.warning(
                    "mixed linears: no memory left for more weight copies (%.0f MiB kept); "
                    "the other linears run in the model dtype only",
                    self.kept_bytes / 2**20,
                )
            self.skipped += 1
            return False


def pack(weight: torch.Tensor, max_tokens: int, budget: CopyBudget) -> MixedWeight:
    weight = weight.detach()
    copy = weight.to(torch.bfloat16).contiguous() if budget.take(weight.numel() * 2) else None
    return MixedWeight(weight, copy, max_tokens)


def mixed_linear(x: torch.Tensor, w: MixedWeight, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x [tokens, in] float32 -> [tokens, out] float32; through the bf16 copy for at most
    `w.max_tokens` tokens."""
    if w.bf16 is None or x.shape[0] > w.max_tokens:
        return F.linear(x, w.float32, bias)
    out = F.linear(x.to(torch.bfloat16), w.bf16).float()
    return out if bias is None else out + bias


# ---------------------------------------------------------------------------- bf16 model, float32 prefill GEMMs
# On AVX512-BF16 CPUs without AMX, bf16 wins decode (half the bytes; oneDNN's packed bf16 GEMM) but
# oneDNN's bf16 GEMM is slower than its float32 one from ~32 rows on (a 1024-token prefill's
# linears ~1.8x): the model stays bf16 and a linear over at least `min_tokens` rows runs a float32
# GEMM on a float32 copy of its weight (kept while memory allows; else it stays bf16).


@dataclass
class Float32PrefillWeight:
    """A bf16 linear's small-input form (the platform's packed bf16 weight, or the weight itself)
    and its float32 copy for inputs of at least `min_tokens` rows."""

    small: torch.Tensor
    small_kernel: Callable
    float32: Optional[torch.Tensor]
    min_tokens: int


def _plain(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return F.linear(x, weight, bias)


def pack_float32_prefill(
    weight: torch.Tensor,
    min_tokens: int,
    budget: CopyBudget,
    small: Optional[tuple[Callable, Callable]] = None,
) -> Float32PrefillWeight:
    weight = weight.detach()
    small_pack, small_kernel = small if small is not None else (lambda w: w, _plain)
    copy = weight.float().contiguous() if budget.take(weight.numel() * 4) else None
    return Float32PrefillWeight(small_pack(weight), small_kernel, copy, min_tokens)


def float32_prefill_linear(
    x: torch.Tensor, w: Float32PrefillWeight, bias: Optional[torch.Tensor]
) -> torch.Tensor:
    """x [tokens, in] bf16 -> [tokens, out] bf16; a float32 GEMM from `w.min_tokens` rows on."""
    if w.float32 is None or x.shape[0] < w.min_tokens:
        return w.small_kernel(x, w.small, bias)
    out = F.linear(x.float(), w.float32, None if bias is None else bias.float())
    return out.to(x.dtype)


# ---------------------------------------------------------------------------- the backends of one choice
class MixedLinears:
    """The mixed linears of one `--dtype auto` choice, held by the CPU platform that made it: the
    (pack, kernel) pairs it hands to layers/linear_prepack.py, and the one copy budget every
    linear they pack draws on."""

    def __init__(self, copy_budget_bytes: Optional[int] = None) -> None:
        self.budget = CopyBudget(copy_budget_bytes)
        self._backends: dict[tuple[str, int], tuple[Callable, Callable]] = {}

    def bf16_copies(self, max_tokens: int) -> tuple[Callable, Callable]:
        """Float32 linears reading a bf16 weight copy for inputs of at most `max_tokens` rows."""
        key = ("bf16", max_tokens)
        if key not in self._backends:
            self._backends[key] = (
                functools.partial(pack, max_tokens=max_tokens, budget=self.budget),
                mixed_linear,
            )
            logger.info(
                "float32 linears with bf16 weight copies (half the float32 weight bytes more, while a quarter "
                "of free RAM allows) for inputs of at most %d token(s)",
                max_tokens,
            )
        return self._backends[key]

    def float32_prefill(
        self, min_tokens: int, small: Optional[tuple[Callable, Callable]] = None
    ) -> tuple[Callable, Callable]:
        """bf16 linears through `small` (the platform's packed bf16 linear, or plain F.linear) below
        `min_tokens` rows, float32 GEMMs on a float32 weight copy from there on."""
        key = ("float32", min_tokens)
        if key not in self._backends:
            packer = functools.partial(
                pack_float32_prefill, min_tokens=min_tokens, budget=self.budget, small=small
            )
            self._backends[key] = packer, float32_prefill_linear
            logger.info(
                "bf16 linears with float32 weight copies (2x the bf16 weight bytes more, while a quarter of "
                "free RAM allows) for inputs of at least %d tokens (prefill)",
                min_tokens,
            )
        return self._backends[key]

    def copies_kept(self) -> tuple[int, int, int]:
        """(linears with a weight copy, their bytes, linears without one) packed so far."""
        return self.budget.kept, self.budget.kept_bytes, self.budget.skipped
