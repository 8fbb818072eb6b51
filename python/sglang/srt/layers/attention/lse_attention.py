"""Attention that returns the log-sum-exp (LSE), for attention split over key sets.

- `sdpa_lse(q, k, v, scale, mask, is_causal)`: 4-D SDPA returning (out, lse). On CPU it uses
  torch's flash kernel (`_scaled_dot_product_flash_attention_for_cpu`, which returns the LSE and
  handles GQA); elsewhere the exact math version `attention_with_lse`. Queries that see no key get
  out = 0 and lse = -inf (so they drop out of `merge_attention_states`).
- `causal_attention_lse(q, q_pos, k, v, k_pos, scale)`: queries at arbitrary ascending absolute
  positions against keys at ascending absolute positions, key visible iff k_pos <= q_pos. Queries
  are processed in blocks: every contiguous run of positions (a zigzag segment) is one block,
  scattered positions (round-robin) are grouped into blocks of up to QUERY_BLOCK rows. For a block
  spanning positions [a, b] the keys before a are attended without a mask and only the keys in
  [a, b] need one (a plain causal square when the block is a contiguous run whose keys are all
  present), and the two parts are merged by their LSE, so the work stays ~ the causal triangle.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.kernels.dispatch import flash_lse_op
from sglang.srt.layers.attention.torch_native import attention_with_lse

QUERY_BLOCK = 1024  # queries per block of scattered positions in causal_attention_lse
MAX_GAP = 64  # a jump in query positions larger than this starts a new block
MIN_RUN = 32  # a contiguous run of at least this many positions is a block of its own



def sdpa_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    attn_mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, Lq, D], k/v [B, Hk, Lk, D] (H a multiple of Hk); `attn_mask` bool, broadcastable to
    [B, H, Lq, Lk], True = attend; `is_causal` top-left aligned. Returns (out [B, H, Lq, Dv] in q's
    dtype, lse [B, H, Lq] float32)."""
    b, h, lq = q.shape[0], q.shape[1], q.shape[2]
    lk = k.shape[2]
    if lk == 0 or lq == 0:
        out = q.new_zeros((b, h, lq, v.shape[-1]))
        return out, torch.full((b, h, lq), float("-inf"), dtype=torch.float32, device=q.device)
    flash = flash_lse_op(q)
    if flash is None:
        return attention_with_lse(q, k, v, scale, attn_mask=attn_mask, is_causal=is_causal)
    float_mask = None
    if attn_mask is not None:
        float_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device)
        float_mask.masked_fill_(~attn_mask, float("-inf"))
    out, lse = flash(q, k.to(q.dtype), v.to(q.dtype), 0.0, is_causal, attn_mask=float_mask, scale=scale)
    if attn_mask is not None:
        # the kernel reports lse = 0 for a fully masked row; make it -inf
        seen = attn_mask.any(dim=-1)  # [.., Lq]
        lse = lse.float().masked_fill(~seen.expand(b, h, lq), float("-inf"))
    return out, lse.float()


def _blocks(q_pos: list[int], block: int, max_gap: int = MAX_GAP, min_run: int = MIN_RUN) -> list[tuple[int, int]]:
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


def merge_two(
    o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`merge_attention_states` of two partials (o [..., L, D], lse [..., L]), computed in float32."""
    m = torch.maximum(l1, l2)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)
    total = w1 + w2
    lse = m + torch.log(total)
    total = torch.where(total == 0, torch.ones_like(total), total)
    out = o1.float().mul_((w1 / total).unsqueeze(-1))
    out.addcmul_(o2.float(), (w2 / total).unsqueeze(-1))
    return out.to(o1.dtype), lse


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
            ob, lb = merge_two(parts_o[0], parts_l[0], parts_o[1], parts_l[1])
        out[s:e] = ob[0].transpose(0, 1)
        lse[s:e] = lb[0].transpose(0, 1)
    return out, lse
