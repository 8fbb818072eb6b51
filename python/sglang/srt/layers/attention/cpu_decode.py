"""Decode attention over long contiguous runs of KV slots without gathering them (`cpu` backend).

A single-token request's KV slots are usually a few long contiguous runs of pool rows (a cached
prefix, its own prefill, ...) plus scattered slots (decode tokens interleaved with other requests'
tokens). Gathering the whole sequence every layer costs a copy of all of its K/V; instead:

- runs of at least `MIN_RUN` slots are attended one SDPA call each over a zero-copy view of the
  head-major pool ([H, rows, D] narrowed to the run),
- the remaining slots of all requests are gathered and attended in one padded SDPA call,
- the partial results are merged exactly by their log-sum-exp (`ops.merge_state`).

A call per run costs more than gathering a short run, so runs shorter than `MIN_RUN` are gathered
(measurements: benchmark/foundation/decode_attention.md). Every request keeps at least one
gathered slot, so no padded row of the gathered call is fully masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from sglang.srt.layers.attention.kv_source import KVGather, KVWorkspace, fetch, widen_kv
from sglang.srt.layers.attention.ops import merge_state, sdpa_lse

MIN_RUN = 1024  # slots; a contiguous run at least this long is attended as a view


@dataclass
class DecodeSegments:
    """Plan for n1 single-token requests: long runs as views, the rest gathered."""

    tail_indices: torch.Tensor  # [n1 * tail_len] slots gathered per request (0 = padding)
    tail_len: int
    tail_mask: Optional[torch.Tensor]  # [n1, 1, 1, tail_len] bool; None when all tails are full
    seg_row: list[int]  # request row (0..n1-1) of each run
    seg_start: list[int]  # first pool row of each run
    seg_len: list[int]
    # Runs merged together: round r holds the r-th run of each request that has one.
    rounds: list[tuple[torch.Tensor, list[int]]]  # (request rows [m] int64, run ids)


def plan_decode_segments(
    kv: torch.Tensor, lens: Sequence[int], min_run: Optional[int] = None
) -> Optional[DecodeSegments]:
    """kv [n1, max_len] slots of single-token requests (valid up to lens[i]). None when no
    request has a run of >= min_run (default `MIN_RUN`) slots: then gather everything."""
    min_run = max(2, MIN_RUN if min_run is None else min_run)  # a shortened run stays >= 1
    n1, max_len = kv.shape
    if max_len < min_run or max(lens) < min_run:
        return None
    device = kv.device
    lens_t = torch.tensor(list(lens), dtype=torch.int64, device=device)
    valid = torch.arange(max_len, device=device).unsqueeze(0) < lens_t.unsqueeze(1)
    starts = ~valid  # every padded position is a run of its own
    starts[:, 0] = True
    starts[:, 1:] |= kv[:, 1:] - kv[:, :-1] != 1
    flat_starts = starts.reshape(-1)
    run_id = torch.cumsum(flat_starts.to(torch.int64), 0) - 1
    run_len = torch.bincount(run_id)
    long_runs = torch.nonzero(run_len >= min_run).reshape(-1)
    if long_runs.numel() == 0:
        return None
    start_pos = torch.nonzero(flat_starts).reshape(-1)[long_runs]  # flat [n1 * max_len] positions
    flat_kv = kv.reshape(-1)
    seg_row = (start_pos // max_len).tolist()
    seg_col = (start_pos % max_len).tolist()
    seg_start = flat_kv[start_pos].tolist()
    seg_len = run_len[long_runs].tolist()
    in_seg = (run_len >= min_run)[run_id].view(n1, max_len)
    # keep >= 1 gathered slot per request: shorten its last run by one where needed
    no_tail = ((valid & ~in_seg).sum(dim=1) == 0).tolist()
    last_of_row: dict[int, int] = {}
    for s, row in enumerate(seg_row):
        if row not in last_of_row or seg_col[s] > seg_col[last_of_row[row]]:
            last_of_row[row] = s
    for row, s in last_of_row.items():
        if no_tail[row]:
            seg_len[s] -= 1
            in_seg[row, seg_col[s] + seg_len[s]] = False
    tail = valid & ~in_seg
    tail_lens = tail.sum(dim=1)
    tail_len = int(tail_lens.max())
    order = torch.sort((~tail).to(torch.int8), dim=1, stable=True).indices[:, :tail_len]
    tail_kv = torch.gather(kv, 1, order)
    tail_mask = None
    if int(tail_lens.min()) != tail_len:
        keep = torch.arange(tail_len, device=device).unsqueeze(0) < tail_lens.unsqueeze(1)
        tail_kv = tail_kv.masked_fill(~keep, 0)
        tail_mask = keep[:, None, None, :]
    rounds_rows: list[list[int]] = []
    rounds_ids: list[list[int]] = []
    seen: dict[int, int] = {}
    for s, row in enumerate(seg_row):
        r = seen.get(row, 0)
        seen[row] = r + 1
        if r == len(rounds_rows):
            rounds_rows.append([])
            rounds_ids.append([])
        rounds_rows[r].append(row)
        rounds_ids[r].append(s)
    rounds = [
        (torch.tensor(rows, dtype=torch.int64, device=device), ids)
        for rows, ids in zip(rounds_rows, rounds_ids)
    ]
    return DecodeSegments(tail_kv.reshape(-1), tail_len, tail_mask, seg_row, seg_start, seg_len, rounds)


def attend_decode_segments(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    plan: DecodeSegments,
    ws: Optional[KVWorkspace],
    scale: float,
    kv_scale: tuple[float, float] = (1.0, 1.0),
) -> torch.Tensor:
    """q [n1, H, D] (one query per request); k/v_buf head-major [Hk, rows, D] (as stored, widened
    to q's dtype times the layer's `kv_scale` (key, value) as read) -> [n1, H, Dv]."""
    n1 = q.shape[0]
    q4 = q.unsqueeze(2)  # [n1, H, 1, D]
    src = KVGather(plan.tail_indices)
    kt = fetch(k_buf, src, ws, "k").view(k_buf.shape[0], n1, plan.tail_len, -1).transpose(0, 1)
    vt = fetch(v_buf, src, ws, "v").view(v_buf.shape[0], n1, plan.tail_len, -1).transpose(0, 1)
    ks, vs = kv_scale
    out, lse = sdpa_lse(
        q4, widen_kv(kt, q.dtype, ks), widen_kv(vt, q.dtype, vs), scale, attn_mask=plan.tail_mask
    )
    for rows, ids in plan.rounds:
        parts = [
            sdpa_lse(
                q4[plan.seg_row[s] : plan.seg_row[s] + 1],
                widen_kv(k_buf.narrow(1, plan.seg_start[s], plan.seg_len[s]).unsqueeze(0), q.dtype, ks),
                widen_kv(v_buf.narrow(1, plan.seg_start[s], plan.seg_len[s]).unsqueeze(0), q.dtype, vs),
                scale,
            )
            for s in ids
        ]
        o_seg = torch.cat([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        l_seg = torch.cat([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
        if len(ids) == n1:  # a run for every request (rows of a round ascend): no scatter
            out, lse = merge_state((out, o_seg), (lse, l_seg))
            continue
        o_m, l_m = merge_state((out.index_select(0, rows), o_seg), (lse.index_select(0, rows), l_seg))
        out = out.index_copy(0, rows, o_m)
        lse = lse.index_copy(0, rows, l_m)
    return out.squeeze(2)
