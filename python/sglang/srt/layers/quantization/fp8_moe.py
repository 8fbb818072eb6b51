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
from torch import nn

from sglang.srt.layers.moe.experts import FusedMoE, fused_experts_ref
from sglang.srt.layers.quantization.fp8_block import FP8_DTYPE, _ceil_div, fp8_block_linear


class Fp8BlockMoEMethod:
    """Holds a FusedMoE's expert weights as FP8 with block scales; FusedMoE calls `apply`."""

    def __init__(self, block: tuple[int, int]):
        self.block = (int(block[0]), int(block[1]))

    def fits(self, moe: FusedMoE) -> bool:
        """Whether every scale block of this rank's experts lies inside one gate / up / down piece
        and one MoE-tp shard."""
        bn, bk = self.block
        i_loc = moe.intermediate_per_partition
        return i_loc % bn == 0 and (moe.tp_size == 1 or i_loc % bk == 0)

    def create_weights(self, moe: FusedMoE) -> None:
        bn, bk = self.block
        e, h, i_loc = moe.num_local_experts, moe.hidden_size, moe.intermediate_per_partition
        for name, shape, scale_shape in (
            ("w13_weight", (e, 2 * i_loc, h), (e, 2 * i_loc // bn, _ceil_div(h, bk))),
            ("w2_weight", (e, h, i_loc), (e, _ceil_div(h, bn), _ceil_div(i_loc, bk))),
        ):
            weight = nn.Parameter(torch.empty(shape, dtype=FP8_DTYPE), requires_grad=False)
            weight.weight_loader = moe.weight_loader  # type: ignore[attr-defined]
            setattr(moe, name, weight)
            scale = nn.Parameter(torch.ones(scale_shape, dtype=torch.float32), requires_grad=False)
            setattr(moe, name + "_scale_inv", scale)
        moe.quant_method = self

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

    def apply(
        self, moe: FusedMoE, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        scales = {id(moe.w13_weight): moe.w13_weight_scale_inv, id(moe.w2_weight): moe.w2_weight_scale_inv}

        def linear(rows: torch.Tensor, w: torch.Tensor, e: int) -> torch.Tensor:
            return fp8_block_linear(rows, w[e], scales[id(w)][e], self.block)

        return fused_experts_ref(
            x, moe.w13_weight, moe.w2_weight, topk_weights, topk_ids, moe.expert_start, linear
        )
