"""Sparse MoE block: router + routed experts (EP / MoE-TP sharded) + optional shared experts.

Shared experts are a SwiGLU MLP TP-sharded over the whole MoE group; their partial output is added
to the routed partial before the single combine (see `ep_dispatch.py`).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import GroupCoordinator, ParallelGroups
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from sglang.srt.layers.moe.ep_dispatch import MoEDispatcher
from sglang.srt.layers.moe.experts import FusedMoE
from sglang.srt.layers.moe.router import MoEGate
from sglang.srt.layers.moe.topk import TopKConfig


class SharedExpertMLP(nn.Module):
    """SwiGLU MLP whose down projection is NOT reduced: returns this rank's partial output."""

    def __init__(self, hidden_size: int, intermediate_size: int, tp: GroupCoordinator, dtype: torch.dtype):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, False, tp, dtype)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, False, tp, dtype, reduce_results=False)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class SparseMoeBlock(nn.Module):
    """Checkpoint names under the block: gate.weight, gate.e_score_correction_bias,
    experts.{e}.{gate,up,down}_proj.weight, shared_experts.{gate,up,down}_proj.weight."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        moe_intermediate_size: int,
        topk_config: TopKConfig,
        groups: ParallelGroups,
        dtype: torch.dtype,
        shared_intermediate_size: int = 0,
        correction_bias: bool = False,
        router_logits_fp32: bool = False,
        tokens_replicated: bool = True,
    ):
        super().__init__()
        self.gate = MoEGate(hidden_size, num_experts, topk_config, dtype, correction_bias, router_logits_fp32)
        self.experts = FusedMoE(num_experts, hidden_size, moe_intermediate_size, groups.moe_ep, groups.moe_tp, dtype)
        self.shared_experts: Optional[SharedExpertMLP] = None
        if shared_intermediate_size:
            self.shared_experts = SharedExpertMLP(hidden_size, shared_intermediate_size, groups.tp, dtype)
        self.dispatcher = MoEDispatcher(groups.tp, tokens_replicated)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.dispatcher.dispatch(x)
        weights, ids = self.gate(tokens)
        out = self.experts(tokens, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        return self.dispatcher.combine(out)
