"""W8A8-INT8 routed experts, kept in 1 byte: each expert's gate / up / down weight int8 with a
per-row `weight_scale` (`experts.{e}.gate_proj.weight_scale`, ...), activations quantized per
token at run time, as the W8A8 linears (`w8a8_int8.py`).

`W8A8Int8MoEMethod` replaces `FusedMoE`'s w13_weight [E_local, 2 I_local, H] and w2_weight
[E_local, H, I_local] by int8 tensors with scales w13_weight_scale [E_local, 2 I_local, 1] (rows
shard with the MoE-tp slice) and w2_weight_scale [E_local, H, 1] (whole on every MoE-tp rank, whose
down projection quantizes its own slice of the intermediate activation); the forward is the torch
expert loop (`fused_experts_ref`) with `w8a8_int8_linear` per selected expert.
"""

from __future__ import annotations

import torch

from sglang.srt.layers.moe.experts import FusedMoE
from sglang.srt.layers.quantization.moe_quant import QuantMoEMethod
from sglang.srt.layers.quantization.w8a8_int8 import w8a8_int8_linear


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
