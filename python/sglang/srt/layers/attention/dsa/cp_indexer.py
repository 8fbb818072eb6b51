"""Lightning Indexer under context parallelism (zero-redundant scoring; see docs/context_parallel.md).

Two forms, by where a query's keys live:

- own queries (`own_query_topk`, FRESH prefills): the request's index keys are all-gathered with
  its latent rows (one async all-gather per layer), and each cp rank scores ONLY the queries it
  holds against them, causally by global position. Per-rank score rows = 1/cp of the total.
- shard candidates (`shard_topk_candidates` + `exchange_and_merge`, decodes and chunks over a
  cached prefix, whose keys are spread over the ranks' KV shards): every rank scores the queries
  against the keys it stores (1/cp of the (query, key) pairs), keeps its local top-k (value,
  position), the candidates are all-gathered and merged with the same total order (score desc,
  earlier position on ties). The merged choice equals single-rank top-k over all keys, and it is
  identical on every rank. Moving `cp · topk` candidates per query is far less than moving the
  sequence's index keys for a decode step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.srt.layers.attention.dsa.scoring import (
    index_scores,
    merge_keys,
    select_topk,
    selection_keys,
    topk_columns,
)

if TYPE_CHECKING:
    from sglang.srt.distributed.group_coordinator import GroupCoordinator

SCORE_BUDGET = 1 << 24  # max score elements (queries * heads * keys) per block
QUERY_BLOCK = 256  # max queries per block (keys past a block's last query are skipped: ~causal work)
MAX_GAP = 64  # a jump in query positions larger than this starts a new block (zigzag segments)


def _row_blocks(q_pos: list[int], block: int) -> list[tuple[int, int]]:
    """[start, end) query-row blocks of at most `block` rows, cut where positions jump by more than
    MAX_GAP, so that a block's key range (up to its last position) stays close to its own rows."""
    out, start = [], 0
    for i in range(1, len(q_pos) + 1):
        if i == len(q_pos) or i - start >= block or q_pos[i] - q_pos[i - 1] > MAX_GAP:
            out.append((start, i))
            start = i
    return out


def own_query_topk(
    q: torch.Tensor, w: torch.Tensor, q_pos: torch.Tensor, keys: torch.Tensor, topk: int, scale: float
) -> torch.Tensor:
    """Top-k positions of queries at ascending positions `q_pos` against `keys` [T, D] at positions
    0..T-1 (a fresh request's index keys); key s is visible to query t iff s <= q_pos[t].

    Returns [m, min(topk, T)] int64, -1 where fewer keys are visible."""
    m, heads = q.shape[0], q.shape[1]
    total = keys.shape[0]
    width = min(topk, total)
    out = torch.full((m, width), -1, dtype=torch.int64, device=q.device)
    if m == 0 or total == 0:
        return out
    qf, wf, kf = q.float(), w.float(), keys.float()
    pos_list = q_pos.tolist()
    block = max(1, min(QUERY_BLOCK, SCORE_BUDGET // max(1, heads * total)))
    for b0, b1 in _row_blocks(pos_list, block):
        upto = int(pos_list[b1 - 1]) + 1  # keys past the block's last query are invisible to all of it
        s = index_scores(qf[b0:b1], wf[b0:b1], kf[:upto].unsqueeze(0), scale)
        visible = torch.arange(upto, device=q.device).unsqueeze(0) <= q_pos[b0:b1].to(q.device).unsqueeze(1)
        k = min(width, upto)
        out[b0:b1, :k] = topk_columns(s.masked_fill(~visible, float("-inf")), k)
    return out


def shard_topk_candidates(
    q: torch.Tensor,
    w: torch.Tensor,
    keys: torch.Tensor,
    key_pos: torch.Tensor,
    visible: torch.Tensor,
    width: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Local top-`width` candidates of queries against this rank's keys.

    q [m, H, D], w [m, H]; keys [m or 1, T, D] (per query, or shared); key_pos [m or 1, T] absolute
    positions of those keys; visible [m, T] bool. Returns (values [m, width] float32, -inf padding;
    positions [m, width] int64, -1 padding)."""
    m, heads = q.shape[0], q.shape[1]
    vals = torch.full((m, width), float("-inf"), dtype=torch.float32, device=q.device)
    pos = torch.full((m, width), -1, dtype=torch.int64, device=q.device)
    total = keys.shape[1]
    if m == 0 or total == 0 or width == 0:
        return vals, pos
    qf, wf = q.float(), w.float()
    shared = keys.shape[0] == 1
    block = max(1, SCORE_BUDGET // max(1, heads * total))
    k = min(width, total)
    for b0 in range(0, m, block):
        b1 = min(m, b0 + block)
        kb = keys if shared else keys[b0:b1]
        s = index_scores(qf[b0:b1], wf[b0:b1], kb.float(), scale).masked_fill(~visible[b0:b1], float("-inf"))
        v, idx = select_topk(s, k)
        kp = key_pos.expand(b1 - b0, -1) if key_pos.shape[0] == 1 else key_pos[b0:b1]
        vals[b0:b1, :k] = v
        pos[b0:b1, :k] = kp.gather(1, idx.clamp(min=0)).masked_fill(idx < 0, -1)
    return vals, pos


def exchange_and_merge(
    group: "GroupCoordinator", vals: torch.Tensor, pos: torch.Tensor, topk: int
) -> torch.Tensor:
    """All-gather every rank's candidates [m, W] and merge them into the global top-k positions
    [m, topk] (identical on every rank; -1 where fewer than topk keys are visible)."""
    m, width = vals.shape
    # one int64 selection key per candidate (score and position, 8 bytes; scoring.selection_keys)
    keys = selection_keys(vals, pos.masked_fill(torch.isinf(vals) & (vals < 0), -1))
    allk = group.all_gather(keys.contiguous(), dim=0).view(group.size, m, width)
    return merge_keys(allk.permute(1, 0, 2).reshape(m, group.size * width), topk)
