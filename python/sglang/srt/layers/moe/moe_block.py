"""Sparse MoE block: router + routed experts (EP / MoE-TP sharded) + optional shared experts.

Shared experts are a SwiGLU MLP TP-sharded over the whole MoE group; their partial output is added
to the routed partial before the single combine (see `ep_dispatch.py`). With an all-to-all dispatch
(`all_to_all=True`, or `ep_all_to_all.moe_all_to_all`: under CP with whole experts per rank) the block runs on this rank's own tokens: it routes them first, the routed
pairs travel to their experts' ranks and back, and the shared experts are replicated (whole on
every rank) and run on this rank's tokens while the pairs are in flight, so the output needs no
combine.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import GroupCoordinator, ParallelGroups
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from sglang.srt.layers.moe.ep_all_to_all import AllToAllDispatcher, moe_all_to_all
from sglang.srt.layers.moe.ep_dispatch import MoEDispatcher
from sglang.srt.layers.moe.experts import FusedMoE
from sglang.srt.layers.moe.router import MoEGate
from sglang.srt.layers.moe.topk import TopKConfig


class SharedExpertMLP(nn.Module):
    """SwiGLU MLP whose down projection is NOT reduced: returns this rank's partial output."""

    def __init__(self, hidden_size: int, intermediate_size: int, tp: GroupCoordinator, dtype: torch.dtype):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, False, tp, dtype)
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, False, tp, dtype, reduce_results=False
        )
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gated = self.gate_up_proj.fused_swiglu(x)
        if gated is None:
            gated = self.act_fn(self.gate_up_proj(x))
        return self.down_proj(gated)


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
        all_to_all: bool = False,
    ):
        super().__init__()
        all_to_all = all_to_all or moe_all_to_all(groups.layout)  # as the communicator lays it out
        self.gate = MoEGate(hidden_size, num_experts, topk_config, dtype, correction_bias, router_logits_fp32)
        self.experts = FusedMoE(
            num_experts, hidden_size, moe_intermediate_size, groups.moe_ep, groups.moe_tp, dtype
        )
        self.shared_experts: Optional[SharedExpertMLP] = None
        if shared_intermediate_size:
            shared_group = groups.local if all_to_all else groups.tp
            self.shared_experts = SharedExpertMLP(hidden_size, shared_intermediate_size, shared_group, dtype)
        self.dispatcher = MoEDispatcher(groups.tp, tokens_replicated)
        self.all_to_all: Optional[AllToAllDispatcher] = None
        if all_to_all:
            if groups.moe_tp.size != 1:
                raise ValueError(
                    "the all-to-all MoE dispatch needs whole experts per rank (--ep-size == --tp-size)"
                )
            self.all_to_all = AllToAllDispatcher(groups.moe_ep, num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.all_to_all is not None:
            weights, ids = self.gate(x)
            shared = None if self.shared_experts is None else (lambda: self.shared_experts(x))
            out, shared_out = self.all_to_all.run(x, weights, ids, self.experts, shared)
            return out if shared_out is None else out + shared_out
        tokens = self.dispatcher.dispatch(x)
        weights, ids = self.gate(tokens)
        out = self.experts(tokens, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        return self.dispatcher.combine(out)
