"""FP8 block-quantized routed experts (DeepSeek-V3 / V3.1 / V3.2's checkpoint format), kept in 1 byte.

Each expert's gate / up / down projection is stored as float8_e4m3fn with its own
`weight_scale_inv` blocks (`experts.{e}.gate_proj.weight_scale_inv`, ...). `Fp8BlockMoEMethod`
replaces `FusedMoE`'s w13_weight [E_local, 2 I_local, H] and w2_weight [E_local, H, I_local] by FP8
tensors with block scales w13_weight_scale_inv [E_local, 2 I_local / bn, ceil(H / bk)] and
w2_weight_scale_inv [E_local, ceil(H / bn), ceil(I_local / bk)]; the forward is the torch expert
loop (`fused_experts_ref`) with each selected expert's weight widened one tile at a time
(`fp8_block_linear`).

Fits when the gate / up boundary and the MoE-tp shards fall on block boundaries (I_local a
multiple of bn, and of bk when moe_tp > 1; DeepSeek-V3's 2048 / 128 at tp up to 16); experts that
do not fit are widened once at load instead (`fits`).
"""

from __future__ import annotations

import torch

from sglang.srt.layers.moe.experts import FusedMoE
from sglang.srt.layers.quantization.fp8_block import FP8_DTYPE, _ceil_div, fp8_block_linear
from sglang.srt.layers.quantization.moe_quant import QuantMoEMethod


class Fp8BlockMoEMethod(QuantMoEMethod):
    """Holds a FusedMoE's expert weights as FP8 with block scales; FusedMoE calls `apply`."""

    weight_dtype = FP8_DTYPE
    scale_suffix = "_scale_inv"

    def __init__(self, block: tuple[int, int]):
        self.block = (int(block[0]), int(block[1]))

    def fits(self, moe: FusedMoE) -> bool:
        """Whether every scale block of this rank's experts lies inside one gate / up / down piece
        and one MoE-tp shard."""
        bn, bk = self.block
        i_loc = moe.intermediate_per_partition
        return i_loc % bn == 0 and (moe.tp_size == 1 or i_loc % bk == 0)

    def scale_shapes(self, moe: FusedMoE) -> tuple[tuple[int, ...], tuple[int, ...]]:
        bn, bk = self.block
        e, h, i_loc = moe.num_local_experts, moe.hidden_size, moe.intermediate_per_partition
        return (e, 2 * i_loc // bn, _ceil_div(h, bk)), (e, _ceil_div(h, bn), _ceil_div(i_loc, bk))

    def expert_linear(self, rows: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return fp8_block_linear(rows, weight, scale, self.block)

    def load_scale(self, moe: FusedMoE, kind: str, expert: int, scale: torch.Tensor) -> None:
        """Copy this rank's part of expert `expert`'s gate ("w1") / up ("w3") / down ("w2") scale
        (the checkpoint's full [ceil(rows / bn), ceil(cols / bk)]); other ranks' experts skipped."""
        local = moe._local(expert)
        if local is None:
            return
        bn, bk = self.block
        i_loc, r = moe.intermediate_per_partition, moe.tp_rank
        if kind == "w2":
            expected = (_ceil_div(moe.hidden_size, bn), _ceil_div(moe.intermediate_size, bk))
        else:
            expected = (_ceil_div(moe.intermediate_size, bn), _ceil_div(moe.hidden_size, bk))
        if tuple(scale.shape) != expected:
            raise ValueError(
                f"expert {expert} {kind} weight_scale_inv: shape {tuple(scale.shape)}, expected {expected}"
            )
        if kind == "w2":
            n = moe.w2_weight_scale_inv.shape[2]
            src, dst = scale.narrow(1, r * i_loc // bk, n), moe.w2_weight_scale_inv.data[local]
        else:
            n = i_loc // bn
            src = scale.narrow(0, r * n, n)
            dst = moe.w13_weight_scale_inv.data[local].narrow(0, 0 if kind == "w1" else n, n)
        dst.copy_(src)
