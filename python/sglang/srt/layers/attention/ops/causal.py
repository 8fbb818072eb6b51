"""Causal attention split over key sets and merged by log-sum-exp.

- `causal_attention_lse(q, q_pos, k, v, k_pos, scale)`: queries at arbitrary ascending absolute
  positions against keys at ascending absolute positions, key visible iff k_pos <= q_pos (the
  local queries of a context-parallel rank). Queries are processed in blocks: every contiguous
  run of positions (a zigzag segment) is one block, scattered positions (round-robin) are grouped
  into blocks of up to QUERY_BLOCK rows. For a block spanning positions [a, b] the keys before a
  are attended without a mask and only the keys in [a, b] need one (a plain causal square when
  the block is a contiguous run whose keys are all present), and the two parts are merged by
  their LSE, so the work stays ~ the causal triangle.
- `attend_prefix_and_chunk`: a prefill chunk over its cached prefix (no mask) plus its own keys
  (causal), merged; equal to one SDPA over both under the offset causal mask.
"""

from __future__ import annotations

import torch

from sglang.srt.layers.attention.ops.lse import sdpa_lse
from sglang.srt.layers.attention.ops.merge import merge_state

QUERY_BLOCK = 1024  # queries per block of scattered positions in causal_attention_lse
MAX_GAP = 64  # a jump in query positions larger than this starts a new block
MIN_RUN = 32  # a contiguous run of at least this many positions is a block of its own


def contiguous_runs(positions: list[int]) -> list[tuple[int, int]]:
    """[start, end) index ranges of `positions` whose values are consecutive integers."""
    runs, start = [], 0
    for i in range(1, len(positions) + 1):
        if i == len(positions) or positions[i] != positions[i - 1] + 1:
            runs.append((start, i))
            start = i
    return runs


def _blocks(
    q_pos: list[int], block: int, max_gap: int = MAX_GAP, min_run: int = MIN_RUN
) -> list[tuple[int, int]]:
    """[start, end) row ranges of ascending positions: each contiguous run of >= min_run
    positions is one block; the other rows form blocks of <= `block` rows, cut where the
    positions jump by more than `max_gap`."""
    runs, start = [], 0
    for i in range(1, len(q_pos) + 1):
        if i == len(q_pos) or q_pos[i] != q_pos[i - 1] + 1:
            runs.append((start, i))
            start = i
    out: list[tuple[int, int]] = []
    open_block: list[int] = []  # [start, end) of the block of short runs being built
    for s, e in runs:
        if e - s >= min_run:
            if open_block:
                out.append((open_block[0], open_block[1]))
                open_block = []
            out.append((s, e))
            continue
        if open_block and (e - open_block[0] > block or q_pos[s] - q_pos[open_block[1] - 1] > max_gap):
            out.append((open_block[0], open_block[1]))
            open_block = []
        if not open_block:
            open_block = [s, e]
        else:
            open_block[1] = e
    if open_block:
        out.append((open_block[0], open_block[1]))
    return out


def causal_attention_lse(
    q: torch.Tensor,
    q_pos: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    block: int = QUERY_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [Lq, H, D] at ascending positions `q_pos`; k/v [Lk, Hk, D] at ascending `k_pos`.
    Returns (out [Lq, H, Dv], lse [Lq, H] float32); key j is visible to query i iff
    k_pos[j] <= q_pos[i]."""
    lq, h = q.shape[0], q.shape[1]
    out = q.new_zeros((lq, h, v.shape[-1]))
    lse = torch.full((lq, h), float("-inf"), dtype=torch.float32, device=q.device)
    if lq == 0 or k.shape[0] == 0:
        return out, lse
    q_list = q_pos.tolist()
    kt, vt = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)  # [1, Hk, Lk, D]
    k_pos_dev = k_pos.to(q.device)
    for s, e in _blocks(q_list, block):
        a, b = q_list[s], q_list[e - 1]
        n_before = int(torch.searchsorted(k_pos, a, right=False))  # keys < a: visible to the whole block
        n_upto = int(torch.searchsorted(k_pos, b, right=True))  # keys <= b
        qb = q[s:e].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        parts_o, parts_l = [], []
        if n_before:
            o1, l1 = sdpa_lse(qb, kt[:, :, :n_before], vt[:, :, :n_before], scale)
            parts_o.append(o1)
            parts_l.append(l1)
        if n_upto > n_before:
            kb, vb = kt[:, :, n_before:n_upto], vt[:, :, n_before:n_upto]
            square = (n_upto - n_before == e - s) and (b - a + 1 == e - s)
            if square:  # the block and its keys are the same contiguous run of positions
                o2, l2 = sdpa_lse(qb, kb, vb, scale, is_causal=True)
            else:
                mask = k_pos_dev[n_before:n_upto].unsqueeze(0) <= q_pos[s:e].to(q.device).unsqueeze(1)
                o2, l2 = sdpa_lse(qb, kb, vb, scale, attn_mask=mask)
            parts_o.append(o2)
            parts_l.append(l2)
        if not parts_o:
            continue
        if len(parts_o) == 1:
            ob, lb = parts_o[0], parts_l[0]
        else:
            ob, lb = merge_state(parts_o, parts_l)
        out[s:e] = ob[0].transpose(0, 1)
        lse[s:e] = lb[0].transpose(0, 1)
    return out, lse


def attend_prefix_and_chunk(
    q: torch.Tensor,
    k_prefix: torch.Tensor,
    v_prefix: torch.Tensor,
    k_chunk: torch.Tensor,
    v_chunk: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a chunk over [cached prefix, chunk]: q [1, H, m, D] are the chunk's
    queries, k/v_prefix [1, Hk, P, D] every key before it, k/v_chunk [1, Hk, m, D] its own keys.

    The prefix is visible to every query (no mask), the chunk causally (`is_causal`, which lets
    the kernel skip the upper triangle); the two partials are merged by their log-sum-exp.
    Equals SDPA over the concatenated keys with the offset causal mask. Returns [1, H, m, Dv].
    """
    o1, l1 = sdpa_lse(q, k_prefix, v_prefix, scale)
    o2, l2 = sdpa_lse(q, k_chunk, v_chunk, scale, is_causal=True)
    return merge_state((o1, o2), (l1, l2))[0]
