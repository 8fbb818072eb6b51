"""bf16 linears at decode sizes on a weight packed in k pairs (kernels/cpu/csrc/bf16_linear.cpp).

oneDNN's packed bf16 linear reads the weights at about half the memory bandwidth at 1-16 rows
(docs/notes/2026-11-step-breakdown.md); `bf16_linear` reads every weight byte once per call for
all rows (AMX-BF16 tiles, or vdpbf16ps) and runs at the read bandwidth. It is the packed copy the
platform hands to layers/linear_prepack.py (`CpuPlatform.prepacked_linear`) in place of oneDNN's
copy (same bytes) where its build runs it on AMX: calls of up to `max_rows` rows (more for narrow
weights: their row tiles stay in L2) take the kernel, larger ones (prefill chunks) the plain
`F.linear` on the bf16 weight, which is as fast as oneDNN's packed one there; and on AMD's
AVX512-BF16 without AMX, where its vdpbf16ps path takes every call.
Measured on [amx] and [zen4]: docs/benchmarks.md, platforms/cpu_linears.py.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

LANES = 16  # output columns per packed block
K_ALIGN = 32  # K padded to one AMX tile row of bf16


def pack_bf16_kpairs(weight: torch.Tensor) -> torch.Tensor:
    """bf16 [N, K] -> int32 [ceil(N / 16), Kp / 2, 16], Kp = K rounded up to 32: element (b, p, l)
    holds column 16b + l's bf16 at k = 2p in its low 16 bits and at k = 2p + 1 in its high 16 bits
    (zero past N and K)."""
    if weight.dtype != torch.bfloat16 or weight.dim() != 2:
        raise ValueError(
            f"pack_bf16_kpairs takes a 2-D bf16 weight, not {weight.dtype} {tuple(weight.shape)}"
        )
    n, k = weight.shape
    blocks, kp = -(-n // LANES), -(-k // K_ALIGN) * K_ALIGN
    padded = torch.zeros(blocks * LANES, kp, dtype=torch.bfloat16, device=weight.device)
    padded[:n, :k] = weight
    bits = padded.view(torch.int16).to(torch.int32) & 0xFFFF
    pairs = bits.view(blocks, LANES, kp // 2, 2)
    return ((pairs[..., 1] << 16) | pairs[..., 0]).transpose(1, 2).contiguous()


class Bf16PackedLinear:
    """The (pack, kernel) pair of layers/linear_prepack.py for `bf16_linear` (the kernel module's
    entry: x [M, K], packed, N, bias -> [M, N]); the kernel is this object (a call runs the linear,
    `swiglu` a [gate; up] layer with its gate)."""

    def __init__(
        self,
        entry: Callable[..., torch.Tensor],
        max_rows: int,
        narrow_k: int = 0,
        narrow_max_rows: int = 0,
    ) -> None:
        self.entry = entry
        self.max_rows = max_rows
        # weights of at most `narrow_k` inputs take the kernel up to `narrow_max_rows` rows instead
        self.narrow_k = narrow_k
        self.narrow_max_rows = max(narrow_max_rows, max_rows)

    def pack(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        # the plain weight travels with its packed copy (larger calls run F.linear on it), and so
        # does the weight's row limit, decided once here rather than on every call
        limit = self.narrow_max_rows if weight.shape[1] <= self.narrow_k else self.max_rows
        return pack_bf16_kpairs(weight), weight, limit

    def __call__(
        self, x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor, int], bias: Optional[torch.Tensor]
    ) -> torch.Tensor:
        kpairs, weight, max_rows = packed
        if x.shape[0] > max_rows:
            return F.linear(x, weight, bias)
        return self.entry(x, kpairs, weight.shape[0], bias)

    def swiglu(
        self, x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor, int], bias: Optional[torch.Tensor]
    ) -> Optional[torch.Tensor]:
        """silu(gate) * up of a [gate; up] layer in one call (the gate in the GEMM's epilogue: the
        [T, 2d] activation is never written; same bits as the kernel's plain call then the kernels'
        silu_and_mul), for a bf16 x of any rows and halves of whole 16-column blocks; else None
        (the caller runs the layer and the gate apart). No row limit, unlike the plain call: without
        the [T, 2d] write and its second read the fused call beats plain F.linear then the gate at
        every size measured (0.46-0.72x at 2,048-8,192 rows on SmolLM2's gate_up, 0.49-0.80x at
        128-2,048 rows on a ~1B Llama's 16384 x 2048, [amx]: docs/benchmarks.md)."""
        kpairs, weight, _ = packed
        n, rows = weight.shape[0], x.shape[0] if x.dim() == 2 else -1
        if rows <= 0 or n % (2 * LANES) or x.dtype != torch.bfloat16:
            return None
        if bias is not None and bias.dtype != torch.bfloat16:
            return None
        return self.entry(x if x.is_contiguous() else x.contiguous(), kpairs, n, bias, True, True)

    def pair(self) -> tuple[Any, Any]:
        return self.pack, self
