"""Expert selection (pure functions on router logits).

- softmax top-k (Qwen3-MoE, Mixtral): probs = softmax(logits); keep the k largest; optionally
  renormalise them to sum to 1 (`norm_topk_prob`).
- sigmoid grouped top-k (DeepSeek-V3 "noaux_tc"): scores = sigmoid(logits); the choice uses
  scores + e_score_correction_bias; experts are split into `n_group` groups, a group's score is the
  sum of its two best choice-scores, only the `topk_group` best groups compete, the k best experts of
  those are chosen; their weights are the *uncorrected* scores, optionally renormalised, times
  `routed_scaling_factor`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class TopKConfig:
    top_k: int
    scoring_func: str = "softmax"  # "softmax" | "sigmoid"
    renormalize: bool = False
    num_expert_group: Optional[int] = None
    topk_group: Optional[int] = None
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.scoring_func not in ("softmax", "sigmoid"):
            raise ValueError(f"unsupported MoE scoring function {self.scoring_func!r}")


def softmax_topk(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def grouped_sigmoid_topk(
    logits: torch.Tensor,
    top_k: int,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool,
    correction_bias: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = logits.float().sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias.float()
    n, num_experts = choice.shape
    if num_expert_group > 1:
        per_group = num_experts // num_expert_group
        grouped = choice.view(n, num_expert_group, per_group)
        group_scores = grouped.topk(min(2, per_group), dim=-1).values.sum(dim=-1)  # [n, G]
        group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False).indices
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)
        expert_mask = group_mask.unsqueeze(-1).expand(n, num_expert_group, per_group).reshape(n, num_experts)
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    ids = torch.topk(choice, k=top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights, ids


def select_experts(
    router_logits: torch.Tensor, config: TopKConfig, correction_bias: Optional[torch.Tensor] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [n, k] float32, expert ids [n, k] int64) of each token."""
    if config.scoring_func == "softmax":
        weights, ids = softmax_topk(router_logits, config.top_k, config.renormalize)
    else:
        weights, ids = grouped_sigmoid_topk(
            router_logits,
            config.top_k,
            config.num_expert_group or 1,
            config.topk_group or 1,
            config.renormalize,
            correction_bias,
        )
    if config.routed_scaling_factor != 1.0:
        weights = weights * config.routed_scaling_factor
    return weights, ids
