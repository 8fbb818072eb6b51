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


# Selection keys: one int64 per (score, position) whose descending order IS the selection order
# (score desc, earlier position on ties): the score's float32 bits mapped to an order-preserving
# int32 in the high half, (2^32 - 1 - position) in the low half. `torch.topk` over unique keys is a
# partial selection (2-3x faster than the full stable sort of the scores it replaces) and
# deterministic; the CP exchange sends the keys (8 bytes a candidate).
NO_KEY = torch.iinfo(torch.int64).min  # padding (position -1): below every real key
_LOW = (1 << 32) - 1


def selection_keys(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 keys of float32 `values` at `positions` (0 <= pos < 2^32, -1 = padding -> NO_KEY).
    -0.0 counts as +0.0 (equal scores tie to the earlier position, as in the float compare)."""
    v = values.float()
    v = torch.where(v == 0, torch.zeros((), dtype=v.dtype), v).contiguous()
    bits = v.view(torch.int32).long()
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return ((ordered << 32) + (_LOW - positions)).masked_fill(positions < 0, NO_KEY)


def key_positions(keys: torch.Tensor) -> torch.Tensor:
    """Positions of `selection_keys` (-1 for NO_KEY)."""
    return (_LOW - (keys & _LOW)).masked_fill(keys == NO_KEY, -1)


def top_keys(keys: torch.Tensor, k: int) -> torch.Tensor:
    """The k highest keys per row, highest first (k <= row length)."""
    return torch.topk(keys, k, dim=-1, sorted=True).values


def select_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [b, k], column indices [b, k]) of the k best columns per row, ties to the lower
    column (whatever the row length); a -inf value gets index -1."""
    k = min(k, scores.shape[-1])
    cols = torch.arange(scores.shape[-1], device=scores.device).expand(scores.shape)
    idx = key_positions(top_keys(selection_keys(scores, cols), k))
    vals = scores.gather(-1, idx)
    return vals, idx.masked_fill(torch.isinf(vals) & (vals < 0), -1)


def topk_columns(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Column indices of `select_topk` (-1 where the value is -inf)."""
    return select_topk(scores, k)[1]


def merge_candidates(values: torch.Tensor, positions: torch.Tensor, k: int) -> torch.Tensor:
    """Global top-k from per-rank candidates.

    values / positions [b, C] (candidates of all ranks side by side; padding: value -inf,
    position -1). Returns [b, k] positions in selection order, -1 where fewer than k keys are
    visible. Positions are unique among the finite candidates (each key lives on one rank)."""
    keys = selection_keys(values, positions.masked_fill(torch.isinf(values) & (values < 0), -1))
    return merge_keys(keys, k)


def merge_keys(keys: torch.Tensor, k: int) -> torch.Tensor:
    """`merge_candidates` over candidates given as `selection_keys` [b, C] (NO_KEY padding)."""
    b, c = keys.shape
    out = key_positions(top_keys(keys, min(k, c))) if c else keys.new_full((b, 0), -1)
    if out.shape[1] < k:
        out = torch.cat([out, out.new_full((b, k - out.shape[1]), -1)], dim=1)
    return out
