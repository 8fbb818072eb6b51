"""Lightning Indexer scoring and top-k selection primitives, shared by the single-rank indexer
(`indexer.py`) and its context-parallel form (`cp_indexer.py`).

Score of query t against key s: `sum_h relu(q[t, h] · k[s] * scale) * w[t, h]` (float32).
Selection order is a total order: higher score first, exact ties to the EARLIER position. Both the
single-rank selection and the merge of per-rank candidates use it, so a top-k merged from shards
equals the top-k over all keys (the global top-k of a union is the top-k of the per-shard top-ks).
Masked (invisible) keys score -inf and are never selected (position -1).
"""

from __future__ import annotations

import torch


def index_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """q [b, H, D] float32, w [b, H] float32, keys [b or 1, T, D] float32 -> scores [b, T]."""
    s = torch.matmul(q, keys.transpose(-1, -2)) * scale  # [b, H, T]
    return torch.bmm(w.unsqueeze(1), torch.relu(s)).squeeze(1)


def select_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [b, k], column indices [b, k]) of the k best columns per row, ties to the lower
    column (stable sort, not `topk`, whose tie order depends on the row length); a -inf value
    gets index -1."""
    vals, idx = torch.sort(scores, dim=-1, descending=True, stable=True)
    vals, idx = vals[:, :k], idx[:, :k]
    return vals, idx.masked_fill(torch.isinf(vals) & (vals < 0), -1)


def topk_columns(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Column indices of `select_topk` (-1 where the value is -inf)."""
    return select_topk(scores, k)[1]


def merge_candidates(values: torch.Tensor, positions: torch.Tensor, k: int) -> torch.Tensor:
    """Global top-k from per-rank candidates.

    values / positions [b, C] (candidates of all ranks side by side; padding: value -inf,
    position -1). Returns [b, k] positions in selection order, -1 where fewer than k keys are
    visible. Positions are unique among the finite candidates (each key lives on one rank)."""
    b, c = values.shape
    if c == 0:
        return positions.new_full((b, k), -1)
    # order by position first, then stable sort by score: ties go to the earlier position
    pos_order = torch.argsort(
        positions.masked_fill(positions < 0, torch.iinfo(torch.int64).max), dim=-1, stable=True
    )
    vals = values.gather(1, pos_order)
    pos = positions.gather(1, pos_order)
    _, top_idx = select_topk(vals, min(k, c))
    out = pos.gather(1, top_idx.clamp(min=0)).masked_fill(top_idx < 0, -1)
    if out.shape[1] < k:
        out = torch.cat([out, out.new_full((b, k - out.shape[1]), -1)], dim=1)
    return out
