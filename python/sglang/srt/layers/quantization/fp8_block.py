"""FP8 (e4m3) weights with 2-D block scales, DeepSeek's format, and the linear method that runs them.

A weight [N, K] is stored as float8_e4m3fn with `weight_scale_inv` [ceil(N/bn), ceil(K/bk)] float32:
the real value of element (i, j) is `weight[i, j] * weight_scale_inv[i // bn, j // bk]`
(DeepSeek writes scale_inv = amax(block) / 448 and weight = w / scale_inv rounded to e4m3).

`Fp8BlockLinearMethod` keeps the weight in 1 byte. Each call widens the weight one tile of output
rows at a time (`TILE_ROWS` rows, a multiple of the block) to the activation dtype and multiplies:
the transient copy is one tile, never the whole weight (a torch reference path; activations are
not quantized, `activation_scheme: dynamic` is served weight-only). On CUDA, once a self-check
there passed, `F.scaled_mm`'s blockwise recipes run it instead, activations quantized per token
and group of 128 as upstream's GPU path does (platforms/accel_fp8.py).

Tensor parallelism: the scale blocks shard with the weight, so every shard boundary (and every
boundary between fused projections) must fall on a block boundary; a layer where one does not is
refused when the model is prepared, naming the layer and sizes.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.platforms.kernel_dispatch import fp8_block_linear_op
from sglang.srt.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
TILE_ROWS = 1024  # output rows widened per step of the forward (rounded to a multiple of the block)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def expand_scales(scale_inv: torch.Tensor, shape: tuple[int, int], block: tuple[int, int]) -> torch.Tensor:
    """The per-element scale [N, K] of block scales [ceil(N/bn), ceil(K/bk)]."""
    bn, bk = block
    full = scale_inv.repeat_interleave(bn, dim=0).repeat_interleave(bk, dim=1)
    return full[: shape[0], : shape[1]]


def block_dequant(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The real weight (in `dtype`) of an FP8 weight and its block scales (products in float32)."""
    n, k = weight.shape
    if tuple(scale_inv.shape) != (_ceil_div(n, block[0]), _ceil_div(k, block[1])):
        raise ValueError(
            f"weight_scale_inv shape {tuple(scale_inv.shape)} does not fit weight {(n, k)} with block {block}"
        )
    return (weight.float() * expand_scales(scale_inv.float(), (n, k), block)).to(dtype)


def is_power_of_two(scale: torch.Tensor) -> bool:
    """Every value a positive power of two (a ue8m0 scale: an exponent, no mantissa bits)."""
    mantissa, _ = torch.frexp(scale.float())
    return bool(((mantissa == 0.5) & (scale > 0)).all())


def block_quantize(
    w: torch.Tensor, block: tuple[int, int], scale_fmt: Optional[str] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's block quantization of a 2-D weight: (float8_e4m3fn weight, float32 scale_inv);
    `scale_fmt="ue8m0"` rounds each scale up to a power of two (V3.1 / V3.2's checkpoints)."""
    n, k = w.shape
    bn, bk = block
    nb, kb = _ceil_div(n, bn), _ceil_div(k, bk)
    padded = torch.zeros(nb * bn, kb * bk, dtype=torch.float32)
    padded[:n, :k] = w.float()
    blocks = padded.view(nb, bn, kb, bk)
    scale_inv = blocks.abs().amax(dim=(1, 3)) / FP8_MAX
    scale_inv = torch.where(scale_inv > 0, scale_inv, torch.ones_like(scale_inv))
    if scale_fmt == "ue8m0":
        scale_inv = torch.exp2(torch.ceil(torch.log2(scale_inv)))
    q = (blocks / scale_inv[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(nb * bn, kb * bk)[:n, :k].contiguous(), scale_inv


def fp8_block_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale_inv: torch.Tensor,
    block: tuple[int, int],
    bias: Optional[torch.Tensor] = None,
    tile_rows: int = TILE_ROWS,
) -> torch.Tensor:
    """x @ dequant(weight)^T (+ bias), widening `tile_rows` output rows of the weight at a time;
    on a device with its own FP8 block GEMM (`kernel_dispatch.fp8_block_linear_op`) that call."""
    device_op = fp8_block_linear_op(x.device)
    if device_op is not None:
        out = device_op(x.reshape(-1, x.shape[-1]), weight, scale_inv, block, bias)
        if out is not None:
            return out.view(*x.shape[:-1], weight.shape[0])
    n, k = weight.shape
    bn = block[0]
    tile = max(bn, tile_rows // bn * bn)
    outs = []
    for r0 in range(0, n, tile):
        rows = min(tile, n - r0)
        w = block_dequant(
            weight[r0 : r0 + rows], scale_inv[r0 // bn : _ceil_div(r0 + rows, bn)], block, x.dtype
        )
        outs.append(F.linear(x, w))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
    return out if bias is None else out + bias


class Fp8BlockLinearMethod:
    """Holds a linear layer's weight as FP8 with block scales; the layer calls `apply` to multiply."""

    def __init__(self, block: tuple[int, int]):
        self.block = (int(block[0]), int(block[1]))

    def create_weights(self, layer: LinearBase, name: str) -> None:
        """Replace `layer.weight` by an FP8 parameter and add `weight_scale_inv` (ValueError where a
        shard or fused-projection boundary falls inside a block)."""
        if isinstance(layer, QKVParallelLinear):
            raise ValueError(
                f"{name}: FP8 block weights in a fused QKV projection are not built yet (issue 30)"
            )
        self._check_boundaries(layer, name)
        out_local, in_local = layer.weight.shape
        bn, bk = self.block
        weight = nn.Parameter(torch.empty(out_local, in_local, dtype=FP8_DTYPE), requires_grad=False)
        weight.weight_loader = layer.weight_loader  # type: ignore[attr-defined]
        scale = nn.Parameter(
            torch.ones(_ceil_div(out_local, bn), _ceil_div(in_local, bk), dtype=torch.float32),
            requires_grad=False,
        )
        scale.weight_loader = self._scale_loader(layer)  # type: ignore[attr-defined]
        layer.weight = weight
        layer.weight_scale_inv = scale
        layer.skip_prepack = True  # the platform's packed copies are for float weights
        layer.quant_method = self

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        return fp8_block_linear(x, layer.weight, layer.weight_scale_inv, self.block, bias)

    def _check_boundaries(self, layer: LinearBase, name: str) -> None:
        bn, bk = self.block
        if isinstance(layer, MergedColumnParallelLinear):
            cuts = [(s, bn, "output") for s in layer.local_sizes]
        elif isinstance(layer, ColumnParallelLinear) and layer.tp_size > 1:
            cuts = [(layer.weight.shape[0], bn, "output")]
        elif isinstance(layer, RowParallelLinear) and layer.tp_size > 1:
            cuts = [(layer.weight.shape[1], bk, "input")]
        else:
            return
        for size, b, what in cuts:
            if size % b:
                raise ValueError(
                    f"{name}: its {what} shard of {size} (tp {layer.tp_size}) is not a multiple of the "
                    f"FP8 weight block {b}: a block's scale would be split between ranks; use another tp size"
                )

    def _scale_loader(self, layer: LinearBase):
        bn = self.block[0]

        def load(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
            loaded = loaded.to(param.dtype)
            if isinstance(layer, MergedColumnParallelLinear):
                if shard_id is None:
                    for i, part in enumerate(torch.split(loaded, [s // bn for s in layer.output_sizes])):
                        load(param, part, i)
                    return
                n = layer.local_sizes[shard_id] // bn
                offset = sum(layer.local_sizes[:shard_id]) // bn
                _copy_slice(param.data.narrow(0, offset, n), loaded, 0, layer.tp_rank, n)
            elif isinstance(layer, ColumnParallelLinear):
                _copy_slice(param.data, loaded, 0, layer.tp_rank, param.shape[0])
            elif isinstance(layer, RowParallelLinear):
                _copy_slice(param.data, loaded, 1, layer.tp_rank, param.shape[1])
            else:
                _copy_slice(param.data, loaded, 0, 0, param.shape[0])

        return load


def _copy_slice(dst: torch.Tensor, src: torch.Tensor, dim: int, rank: int, n: int) -> None:
    if src.dim() != 2 or src.shape[dim] < (rank + 1) * n:
        raise ValueError(f"weight_scale_inv: checkpoint shape {tuple(src.shape)} too small for rank {rank}")
    part = src.narrow(dim, rank * n, n)
    if tuple(part.shape) != tuple(dst.shape):
        raise ValueError(
            f"weight_scale_inv: shape mismatch, parameter {tuple(dst.shape)} vs {tuple(part.shape)}"
        )
    dst.copy_(part)
