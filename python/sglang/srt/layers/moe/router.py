"""MoE router ("gate"): router logits from the hidden state, then expert selection (`topk.py`).

Replicated on every rank (it is small), so every rank routes every token identically. `weight` is
[num_experts, hidden]; with `correction_bias` the gate also holds DeepSeek's float32
`e_score_correction_bias` [num_experts] (checkpoint name `...mlp.gate.e_score_correction_bias`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.linear import default_weight_loader
from sglang.srt.layers.moe.topk import TopKConfig, select_experts


def _param(shape: tuple[int, ...], dtype: torch.dtype) -> nn.Parameter:
    p = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
    p.weight_loader = default_weight_loader  # type: ignore[attr-defined]
    return p


class MoEGate(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        topk_config: TopKConfig,
        dtype: torch.dtype,
        correction_bias: bool = False,
        logits_in_fp32: bool = False,
    ):
        super().__init__()
        self.topk_config = topk_config
        self.logits_in_fp32 = logits_in_fp32
        self.weight = _param((num_experts, hidden_size), dtype)
        if correction_bias:
            self.e_score_correction_bias = _param((num_experts,), torch.float32)
        else:
            self.register_parameter("e_score_correction_bias", None)

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.logits_in_fp32:
            return F.linear(x.float(), self.weight.float())
        return F.linear(x, self.weight)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, hidden] -> (weights [n, k] float32, expert ids [n, k])."""
        return select_experts(self.router_logits(x), self.topk_config, self.e_score_correction_bias)
