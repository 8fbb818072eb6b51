"""The exchange + merge of partial attentions under context parallelism (`torch_native_cp.py`,
`mla_cp.py`): each cp rank has the partial (out, lse) of some queries over its own KV shard, and
the exact result is their LSE merge (`ops.merge_state`).

- Replicated queries (the old decode path, `CPLayout.split_decodes` off): the partials are
  all-gathered and every rank merges every query (cp × the bytes of the partials per rank).
- Split queries (each held by one rank): the partials go to the query's holder by one all-to-all
  (`cp_exchange.exchange_to_holders`) and each rank merges only its own queries' partials.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.attention.ops import merge_state
from sglang.srt.layers.context_parallel import CPLayout
from sglang.srt.layers.cp_exchange import exchange_to_holders


def merge_partials(
    layout: CPLayout, part_o: torch.Tensor, part_l: torch.Tensor, holders: Optional[torch.Tensor]
) -> tuple[Optional[torch.Tensor], torch.Tensor]:
    """part_o [n, H, D], part_l [n, H] this rank's partials of n queries (the same queries, in the
    same order, on every rank). `holders` [n]: the rank holding each query, or None when every
    rank keeps every query. Returns (mine: the query indices merged here, None meaning all of
    them; merged [len(mine), H, D] float32)."""
    n, h, d = part_o.shape
    packed = torch.cat([part_o.float().reshape(n, h * d), part_l.float()], dim=1)
    mine = None
    if holders is None:
        parts = layout.group.all_gather(packed, dim=0).view(layout.cp_size, n, h * d + h)
    else:
        mine, parts = exchange_to_holders(layout.group, packed, holders)
    m = parts.shape[1]
    outs = [parts[r, :, : h * d].view(m, h, d) for r in range(layout.cp_size)]
    lses = [parts[r, :, h * d :] for r in range(layout.cp_size)]
    merged, _ = merge_state(outs, lses)
    layout.count("merged_rows", m)
    return mine, merged
