"""FP8 block linears on CUDA: DeepSeek's format (float8_e4m3fn weights with 128 x 128 block scales,
`weight_scale_inv`) on torch's `F.scaled_mm` with the BlockWise1x128 (activations) and
BlockWise128x128 (weights) recipes, as upstream's GPU path multiplies them: the activations
quantized to FP8 per token and group of 128 (scale = amax / 448, dynamic), both scales applied by
the GEMM, output in the activation dtype.

No GPU has run this in this project, so the op is taken only after it passed a self-check on the
device it serves (`checked_fp8_block_linear`: one small random case against the same math in
float32 torch); a device, driver or torch build where the call fails or disagrees keeps the
layers' tiled widening path (`fp8_block.fp8_block_linear`), with a warning. Shapes the recipes do
not take (a block other than 128 x 128, K or N not a multiple of 128) also keep that path.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

FP8_MAX = 448.0
GROUP = 128


def per_token_group_fp8(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of `group`) -> (float8_e4m3fn [M, K], float32 scales [M, K / group]):
    each row's groups of `group` scaled by amax / 448 (an all-zero group: scale 1)."""
    m, k = x.shape
    xg = x.float().view(m, k // group, group)
    amax = xg.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (xg / scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(m, k)
    return q, scale.view(m, k // group)


def fp8_block_reference(x_q, x_scale, weight, scale_inv, out_dtype) -> torch.Tensor:
    """The same math in float32 torch: both operands widened with their scales (the layers'
    `block_dequant`: 1 x 128 groups, 128 x 128 blocks), then multiplied."""
    from sglang.srt.layers.quantization.fp8_block import block_dequant  # (as cpu_linears.py: lazily)

    a = block_dequant(x_q, x_scale, (1, GROUP))
    w = block_dequant(weight, scale_inv, (GROUP, GROUP))
    return (a @ w.t()).to(out_dtype)


class CudaFp8BlockLinear:
    """x [M, K] @ dequant(weight [N, K] fp8, scale_inv [N/128, K/128])^T on `F.scaled_mm`
    (`scaled_mm` injectable for tests); None where the recipes do not take the shapes."""

    def __init__(self, scaled_mm: Optional[Callable[..., torch.Tensor]] = None):
        self.scaled_mm = scaled_mm or F.scaled_mm

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        scale_inv: torch.Tensor,
        block: tuple[int, int],
        bias: Optional[torch.Tensor],
    ) -> Optional[torch.Tensor]:
        n, k = weight.shape
        if tuple(block) != (GROUP, GROUP) or k % GROUP or n % GROUP or x.dim() != 2 or x.shape[0] == 0:
            return None
        q, scale = per_token_group_fp8(x)
        out = self.scaled_mm(
            q,
            weight.t(),
            scale,
            F.ScalingType.BlockWise1x128,
            scale_inv.float(),
            F.ScalingType.BlockWise128x128,
            output_dtype=x.dtype,
        )
        return out if bias is None else out + bias


def checked_fp8_block_linear(device: torch.device, op: Any = None) -> Optional[Any]:
    """`op` (default: `CudaFp8BlockLinear()`) if it computes a small random case on `device` as
    `fp8_block_reference` does (relative error under 2 %), else None with a warning naming why."""
    op = op or CudaFp8BlockLinear()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 256, generator=g).to(device=device, dtype=torch.bfloat16)
    weight = (torch.randn(256, 256, generator=g) * 100).to(torch.float8_e4m3fn).to(device)
    scale_inv = (torch.rand(2, 2, generator=g) * 1e-3 + 1e-4).to(device)
    try:
        got = op(x, weight, scale_inv, (GROUP, GROUP), None)
        want = fp8_block_reference(*per_token_group_fp8(x), weight, scale_inv, torch.float32)
        err = float((got.float() - want).norm() / want.norm())
    except Exception as e:  # noqa: BLE001 - any failure of the call means: keep the tiled path
        logger.warning("FP8 block GEMM (F.scaled_mm, blockwise) unavailable on %s: %s", device, e)
        return None
    if not err < 0.02:
        logger.warning(
            "FP8 block GEMM (F.scaled_mm, blockwise) disagrees on %s (rel. error %.3g)", device, err
        )
        return None
    return op
