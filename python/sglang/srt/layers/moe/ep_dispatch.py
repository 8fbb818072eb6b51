"""How tokens reach the experts of other ranks and how their outputs come back (EP / MoE-TP).

Scheme: all-gather + local experts + reduce. Every rank of the MoE group (the stage's tp ranks, seen
as moe_ep × moe_tp) routes ALL the group's tokens, computes the partial output of the experts it
holds (its slice of their intermediate dim), and the partials are summed across the group.

- `tokens_replicated=True` (attention TP, no DP attention: every rank already holds the same
  tokens): dispatch is the identity and combine is one all-reduce over the group. The shared
  experts' partial (TP-sharded over the same group) is added before it, so an MoE layer costs one
  all-reduce, exactly like a dense TP MLP.
- `tokens_replicated=False` (ranks hold different tokens: DP attention, CP): dispatch
  all-gathers the tokens (sizes may differ), combine all-reduces and keeps this rank's rows.

Exact: no capacity factor, no token is dropped; every (token, expert) pair is computed once
(per moe_tp slice). An all-to-all dispatch (send each token only to the ranks of its experts) moves
fewer bytes when tokens are partitioned and experts are many; it can replace this class without
touching the experts.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.distributed.parallel_state import GroupCoordinator


class MoEDispatcher:
    def __init__(self, group: Optional[GroupCoordinator], tokens_replicated: bool = True):
        self.group = group
        self.tokens_replicated = tokens_replicated
        self._sizes: Optional[list[int]] = None

    @property
    def size(self) -> int:
        return self.group.size if self.group is not None else 1

    def dispatch(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens every rank must route and run through its experts."""
        if self.size == 1 or self.tokens_replicated:
            return x
        parts = self.group.all_gather_uneven(x, dim=0)
        self._sizes = [p.shape[0] for p in parts]
        return torch.cat(parts, dim=0)

    def combine(self, partial: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's partial output, for this rank's tokens."""
        if self.size == 1:
            return partial
        out = self.group.all_reduce(partial)
        if self.tokens_replicated:
            return out
        sizes, self._sizes = self._sizes, None
        assert sizes is not None, "combine() without dispatch()"
        start = sum(sizes[: self.group.rank])
        return out.narrow(0, start, sizes[self.group.rank])
