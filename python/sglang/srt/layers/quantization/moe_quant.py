"""What the quantized routed-expert methods share (`fp8_moe.py`, `w8a8_moe.py`): replacing a
FusedMoE's w13 / w2 weights by 1-byte parameters with scales beside them, and the torch expert loop
with a per-expert quantized linear."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.layers.moe.experts import FusedMoE, fused_experts_ref


class QuantMoEMethod:
    """Base: subclasses set `weight_dtype`, `scale_suffix`, `scale_shapes(moe)` and
    `expert_linear(rows, weight, scale)`."""

    weight_dtype: torch.dtype
    scale_suffix: str

    def scale_shapes(self, moe: FusedMoE) -> tuple[tuple[int, ...], tuple[int, ...]]:
        raise NotImplementedError

    def expert_linear(self, rows: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def create_weights(self, moe: FusedMoE) -> None:
        """w13_weight [E_local, 2 I_local, H] and w2_weight [E_local, H, I_local] in `weight_dtype`,
        with `w13_weight<scale_suffix>` / `w2_weight<scale_suffix>` float32 scales."""
        e, h, i_loc = moe.num_local_experts, moe.hidden_size, moe.intermediate_per_partition
        shapes = ((e, 2 * i_loc, h), (e, h, i_loc))
        for name, shape, scale_shape in zip(("w13_weight", "w2_weight"), shapes, self.scale_shapes(moe)):
            weight = nn.Parameter(torch.empty(shape, dtype=self.weight_dtype), requires_grad=False)
            weight.weight_loader = moe.weight_loader  # type: ignore[attr-defined]
            setattr(moe, name, weight)
            scale = nn.Parameter(torch.ones(scale_shape, dtype=torch.float32), requires_grad=False)
            setattr(moe, name + self.scale_suffix, scale)
        moe.quant_method = self

    def apply(
        self, moe: FusedMoE, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        scales = {
            id(moe.w13_weight): getattr(moe, "w13_weight" + self.scale_suffix),
            id(moe.w2_weight): getattr(moe, "w2_weight" + self.scale_suffix),
        }

        def linear(rows: torch.Tensor, w: torch.Tensor, e: int) -> torch.Tensor:
            return self.expert_linear(rows, w[e], scales[id(w)][e])

        return fused_experts_ref(
            x, moe.w13_weight, moe.w2_weight, topk_weights, topk_ids, moe.expert_start, linear
        )
