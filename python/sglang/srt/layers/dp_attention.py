"""Rows across attention-DP replicas (docs/dp_attention.md): the two primitives behind the FULL
token layout. Only `layers/communicator.py` and the logits processor call them.

Replica d's rows sit at offset `sum(counts[:d])` of the FULL layout. A gather builds the FULL rows
with ONE all-reduce over the stage's tp group (the replicas may bring different row counts, which
an all-gather would have to pad): every replica writes its rows into a zeroed buffer at its offset
and the sum fills in everybody's. Two variants:
- partial: the rows are this rank's partial sums over the attention-TP group (an o_proj whose
  reduction was left to the gather); every rank writes, and the same all-reduce completes them;
- replicated: the rows are complete and equal on every rank of the replica; only its first rank
  writes.
A scatter is a slice: this replica's rows of a FULL tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from sglang.srt.distributed.parallel_state import ParallelGroups


def dp_gather(
    x: torch.Tensor, counts: Sequence[int], replica: int, groups: "ParallelGroups", partial: bool
) -> torch.Tensor:
    """This replica's rows `x` [counts[replica], ...] -> every replica's rows [sum(counts), ...]."""
    start, n = sum(counts[:replica]), counts[replica]
    if x.shape[0] != n:
        raise ValueError(f"dp_gather: this replica brings {x.shape[0]} rows, the step's counts say {n}")
    full = x.new_zeros((sum(counts),) + tuple(x.shape[1:]))
    if n and (partial or groups.replica.is_first):
        full.narrow(0, start, n).copy_(x)
    return groups.tp.all_reduce(full)


def dp_scatter(full: torch.Tensor, counts: Sequence[int], replica: int) -> torch.Tensor:
    """This replica's rows of a FULL tensor (a view)."""
    return full.narrow(0, sum(counts[:replica]), counts[replica])
