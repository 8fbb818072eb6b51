"""W8A8-INT8 routed experts, kept in 1 byte: each expert's gate / up / down weight int8 with a
per-row `weight_scale` (`experts.{e}.gate_proj.weight_scale`, ...), activations quantized per
token at run time, as the W8A8 linears (`w8a8_int8.py`).

`W8A8Int8MoEMethod` replaces `FusedMoE`'s w13_weight [E_local, 2 I_local, H] and w2_weight
[E_local, H, I_local] by int8 tensors with scales w13_weight_scale [E_local, 2 I_local, 1] (rows
shard with the MoE-tp slice) and w2_weight_scale [E_local, H, 1] (whole on every MoE-tp rank, whose
down projection quantizes its own slice of the intermediate activation); the forward is the torch
expert loop (`fused_experts_ref`) with `w8a8_int8_linear` per selected expert.

After loading, where the platform's kernel build has the fused int8 linear (`int8_linear_op`),
`pack_weights` packs every local expert's w13 and w2 for it (`pack_int8_vnni`, as the W8A8 linears;
the packed copies replace the plain int8 weights, which move to the meta device). The loop then
calls the fused kernel per expert (the same int32 sums and float rounding as `w8a8_int8_linear`),
with the SwiGLU gate in w13's epilogue for bf16 activations (the [rows, 2 I] activation never
written; the same bits as the kernel's call then its silu_and_mul).
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.moe.experts import FusedMoE, fused_experts_ref
from sglang.srt.layers.quantization.moe_quant import QuantMoEMethod
from sglang.srt.layers.quantization.w8a8_int8 import (
    PACK_LANES,
    fused_int8_linear,
    meta_like,
    pack_int8_vnni,
    w8a8_int8_linear,
)
from sglang.srt.platforms.kernel_dispatch import int8_linear_op


class W8A8Int8MoEMethod(QuantMoEMethod):
    """Holds a FusedMoE's expert weights as int8 with per-row scales; FusedMoE calls `apply`."""

    weight_dtype = torch.int8
    scale_suffix = "_scale"

    def fits(self, moe: FusedMoE) -> bool:
        return True  # per-row scales shard with any row split

    def scale_shapes(self, moe: FusedMoE) -> tuple[tuple[int, ...], tuple[int, ...]]:
        e, h, i_loc = moe.num_local_experts, moe.hidden_size, moe.intermediate_per_partition
        return (e, 2 * i_loc, 1), (e, h, 1)

    def expert_linear(self, rows: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return w8a8_int8_linear(rows, weight, scale)

    def pack_weights(self, moe: FusedMoE) -> Optional[int]:
        """After loading: every local expert's w13 / w2 packed for the fused int8 linear where the
        kernel build has one (`moe.int8_experts`: [(w13 packed, w2 packed)] per local expert); the
        plain int8 weights move to the meta device. Returns the bytes this adds, or None where
        nothing was packed (no kernel, or packed already)."""
        if moe.w13_weight.is_meta:
            return None
        op = int8_linear_op(moe.w13_weight.device)
        if op is None:
            return None
        pairs = ((moe.w13_weight, moe.w13_weight_scale), (moe.w2_weight, moe.w2_weight_scale))
        experts = [
            tuple((*pack_int8_vnni(w[e].detach(), s[e].detach()), op) for w, s in pairs)
            for e in range(moe.num_local_experts)
        ]
        added = sum(t.numel() * t.element_size() for ex in experts for p in ex for t in p[:3])
        freed = sum(w.numel() * w.element_size() for w, _ in pairs)
        moe.w13_weight, moe.w2_weight = meta_like(moe.w13_weight), meta_like(moe.w2_weight)
        moe.int8_experts = experts
        return added - freed

    def apply(
        self, moe: FusedMoE, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        experts = getattr(moe, "int8_experts", None)
        if experts is None:
            return super().apply(moe, x, topk_weights, topk_ids)
        n13, n2 = moe.w13_weight.shape[1], moe.w2_weight.shape[1]

        def linear(rows: torch.Tensor, w: torch.Tensor, e: int) -> torch.Tensor:
            i, n = (0, n13) if w is moe.w13_weight else (1, n2)
            return fused_int8_linear(rows, experts[e][i], n)  # float16 rows: widened there

        def swiglu(rows: torch.Tensor, e: int) -> torch.Tensor:
            return fused_int8_linear(rows, experts[e][0], n13, swiglu=True)

        # the gate in w13's epilogue: bf16 x, halves of whole 16-column blocks (`apply_swiglu`'s terms)
        gated = x.dtype == torch.bfloat16 and n13 % (2 * PACK_LANES) == 0
        return fused_experts_ref(
            x,
            moe.w13_weight,
            moe.w2_weight,
            topk_weights,
            topk_ids,
            moe.expert_start,
            linear,
            swiglu if gated else None,
        )

    def load_scale(self, moe: FusedMoE, kind: str, expert: int, scale: torch.Tensor) -> None:
        """Copy this rank's rows of expert `expert`'s gate ("w1") / up ("w3") / down ("w2") scale
        (the checkpoint's full [rows] or [rows, 1]); other ranks' experts skipped."""
        local = moe._local(expert)
        if local is None:
            return
        scale = scale.float().reshape(-1, 1)
        i_loc, r = moe.intermediate_per_partition, moe.tp_rank
        expected = moe.hidden_size if kind == "w2" else moe.intermediate_size
        if scale.shape[0] != expected:
            raise ValueError(
                f"expert {expert} {kind} weight_scale: {scale.shape[0]} rows, expected {expected}"
            )
        if kind == "w2":
            moe.w2_weight_scale.data[local].copy_(scale)
        else:
            dst = moe.w13_weight_scale.data[local].narrow(0, 0 if kind == "w1" else i_loc, i_loc)
            dst.copy_(scale.narrow(0, r * i_loc, i_loc))
