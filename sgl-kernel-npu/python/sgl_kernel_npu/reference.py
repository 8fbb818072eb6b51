"""Torch reference of the DSA ops (the oracle every other implementation is tested against).

All three work on the canonical form of `layouts.py`, in float32, with plain tensor ops:

- `indexer_topk`: score[t, j] = sum_h relu(q[t, h] . k[j]) * w[t, h] over the visible keys
  j < kv_end[t]; the `k` best positions per query (score descending, exact ties to the earlier
  position), -1 / -inf where fewer keys are visible. Memory is bounded by scoring blocks of
  queries of one request at a time.
- `sparse_attention`: each query attends to the key rows its indices select (absorbed MLA:
  one shared kv head; scores = q . k (+ q_rope . k_rope), softmax, weighted sum of value rows);
  returns the output [T, N, Dv] and the log-sum-exp [T, N] (natural log; -inf and a zero output
  for a query with no valid index).
- `merge_attn_states`: partial attentions of the same queries over disjoint key sets, combined
  by their log-sum-exp.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from sgl_kernel_npu.layouts import FP8_KEY_BLOCK, FP8_KEY_DTYPE, PagedKeys, Queries

SCORE_BUDGET = 1 << 24  # score elements (queries x heads x keys) per block


def select_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [b, k], columns [b, k]) of the k best columns per row: stable sort, so exact ties
    go to the lower column; -inf values get column -1. Pads to k columns."""
    b, c = scores.shape
    vals, idx = torch.sort(scores, dim=-1, descending=True, stable=True)
    vals, idx = vals[:, :k], idx[:, :k]
    idx = idx.masked_fill(torch.isinf(vals) & (vals < 0), -1)
    if c < k:
        vals = torch.cat([vals, vals.new_full((b, k - c), float("-inf"))], dim=1)
        idx = torch.cat([idx, idx.new_full((b, k - c), -1)], dim=1)
    return vals, idx


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of each row of x [..., D]: (values int8 [..., D], scales float32 [...]) with
    scale = amax / 127 and value = round-half-even(x * (127 / amax)) (all 0 for a zero row), in
    float32 ops the CPU kernels repeat exactly (so both see the same integers)."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    c127 = torch.full_like(
        amax, 127.0
    )  # tensor / tensor: IEEE division (a scalar divisor may be a reciprocal)
    inv = torch.where(amax > 0, c127 / amax, torch.zeros_like(amax))
    q = torch.round((x * inv).clamp_(-127, 127)).to(torch.int8)
    return q, (amax / c127).squeeze(-1)


def widen_keys(rows: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn key rows [n, D] with their block scales [n, ceil(D / FP8_KEY_BLOCK)] -> float32
    [n, D]: each code widened (exact) times its block's scale (one float32 multiply: the CPU
    kernels repeat it)."""
    per_value = scale.float().repeat_interleave(FP8_KEY_BLOCK, dim=-1)[..., : rows.shape[-1]]
    return rows.float() * per_value


def widen_rows(rows: torch.Tensor, kv_scale: float = 1.0) -> torch.Tensor:
    """Latent rows in float32: FP8 codes widened (exact) times `kv_scale`; other dtypes as given."""
    if rows.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return rows.float() * kv_scale
    return rows.float()


def int8_dot_exact(dim: int) -> None:
    """int8 dot products of `dim` terms are exact in float32 (|sum| < 2^24) up to dim 1040."""
    if dim * 127 * 127 >= 1 << 24:
        raise ValueError(
            f"int8 index scoring needs head dim <= 1040 for exact float32 dot products, got {dim}"
        )


def indexer_topk(
    qs: Queries, weights: torch.Tensor, keys: PagedKeys, k: int, score_dtype: Optional[torch.dtype] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices [T, k] int32, values [T, k] float32). score_dtype bfloat16: q and the keys are
    rounded to bf16 first (then float32 math: products of bf16 values are exact in float32).
    score_dtype int8: each query head row and key row quantized (`quantize_int8`, or an int8 key
    cache's rows and scales), score = s_k * sum_h (w_h * s_qh) * relu(q8_h . k8): the integer dot
    products exact in float32, the head sum in float32. float8_e4m3fn keys (with block scales) are
    widened first (`widen_keys`), then scored like float32 keys at `score_dtype`."""
    bf16 = score_dtype == torch.bfloat16
    fp8 = keys.rows.dtype == FP8_KEY_DTYPE
    int8 = score_dtype == torch.int8 or keys.rows.dtype == torch.int8
    q = qs.q.to(torch.bfloat16) if bf16 else qs.q
    if int8:
        int8_dot_exact(q.shape[-1])
        q8, q_scale = quantize_int8(q)
        q, weights = q8.float(), weights.float() * q_scale
    t_total, heads, _ = q.shape
    dev = q.device
    out_idx = torch.full((t_total, k), -1, dtype=torch.int32, device=dev)
    out_val = torch.full((t_total, k), float("-inf"), dtype=torch.float32, device=dev)
    if t_total == 0 or k == 0:
        return out_idx, out_val
    batch = qs.batch.long()
    for b in torch.unique(batch).tolist():
        rows = torch.nonzero(batch == b).flatten()
        kv_len = int(keys.kv_lens[b])
        if kv_len == 0:
            continue
        pos = torch.arange(kv_len, device=dev)
        slots = keys.slots(torch.tensor(b, device=dev), pos)
        kb = keys.rows.index_select(0, slots)  # [S, D]
        if fp8:
            kb = widen_keys(kb, keys.scale.index_select(0, slots))
        if keys.scale is not None and not fp8:
            k_scale = keys.scale.float().index_select(0, slots)
        elif int8:
            kb, k_scale = quantize_int8(kb)
        kb = (kb.to(torch.bfloat16) if bf16 else kb).float()
        block = max(1, SCORE_BUDGET // max(1, heads * kv_len))
        for s in range(0, rows.numel(), block):
            r = rows[s : s + block]
            sc = torch.einsum("thd,sd->ths", q[r].float(), kb).relu_()
            sc = torch.einsum("ths,th->ts", sc, weights[r].float())
            if int8:
                sc = sc * k_scale
            sc = sc.masked_fill(pos.unsqueeze(0) >= qs.kv_end[r].long().unsqueeze(1), float("-inf"))
            vals, idx = select_topk(sc, k)
            out_idx[r] = idx.to(torch.int32)
            out_val[r] = vals
    return out_idx, out_val


def sparse_attention(
    q: torch.Tensor,
    q_rope: Optional[torch.Tensor],
    key: PagedKeys,
    key_rope: Optional[torch.Tensor],
    value: torch.Tensor,
    batch: torch.Tensor,
    limit: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    kv_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, N, Dk], q_rope [T, N, Dr] or None; key (rows [R, Dk] + block table), key_rope rows
    [R, Dr] and value rows [R, Dv] addressed by the same block table; indices [T, K] positions
    (valid: 0 <= index < limit[t]; -1 pads). FP8 rows are widened times `kv_scale` (`widen_rows`).
    Returns (out [T, N, Dv] in q's dtype, lse [T, N])."""
    t_total, heads, _ = q.shape
    dv = value.shape[-1]
    out = torch.zeros((t_total, heads, dv), dtype=torch.float32, device=q.device)
    lse = torch.full((t_total, heads), float("-inf"), dtype=torch.float32, device=q.device)
    if t_total == 0 or indices.shape[1] == 0:
        return out.to(q.dtype), lse
    kv_len = limit.long().unsqueeze(1)
    idx = indices.long()
    valid = (idx >= 0) & (idx < kv_len)
    slots = key.slots(batch.long().unsqueeze(1), idx.clamp(min=0)).masked_fill(~valid, 0)
    block = max(1, SCORE_BUDGET // max(1, indices.shape[1] * (q.shape[-1] + dv)))
    for s in range(0, t_total, block):
        e = min(t_total, s + block)
        flat = slots[s:e].reshape(-1)
        kr = widen_rows(key.rows.index_select(0, flat), kv_scale).view(e - s, -1, key.rows.shape[-1])
        sc = torch.einsum("thd,tkd->thk", q[s:e].float(), kr)
        if q_rope is not None:
            rr = widen_rows(key_rope.index_select(0, flat), kv_scale).view(e - s, -1, key_rope.shape[-1])
            sc = sc + torch.einsum("thd,tkd->thk", q_rope[s:e].float(), rr)
        sc = (sc * scale).masked_fill(~valid[s:e].unsqueeze(1), float("-inf"))
        lse[s:e] = torch.logsumexp(sc, dim=-1)
        p = torch.nan_to_num(torch.softmax(sc, dim=-1), nan=0.0)
        vr = widen_rows(value.index_select(0, flat), kv_scale).view(e - s, -1, dv)
        out[s:e] = torch.einsum("thk,tkd->thd", p, vr)
    return out.to(q.dtype), lse


def merge_attn_states(
    outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine partial attentions of the same queries over disjoint key sets.

    outs[r] [..., L, D], lses[r] [..., L] (float32; -inf for a query that saw no key of part r).
    With m = max_r lse_r, w_r = exp(lse_r - m) and W = sum_r w_r: lse = m + log W and
    out = sum_r (w_r / W) * out_r, accumulated in float32. A query with no key in any part gets
    out = 0 and lse = -inf. Returns (out in outs[0]'s dtype, lse float32). When outs[0] is
    float32 it is used as the accumulator (overwritten): pass partials not needed afterwards.
    """
    m = lses[0]
    for lse_r in lses[1:]:
        m = torch.maximum(m, lse_r)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    weights = [torch.exp(lse_r - m) for lse_r in lses]
    total = weights[0]
    for w in weights[1:]:
        total = total + w
    lse = m + torch.log(total)
    total = torch.where(total == 0, torch.ones_like(total), total)
    out = outs[0].float().mul_((weights[0] / total).unsqueeze(-1))
    for o, w in zip(outs[1:], weights[1:]):
        out.addcmul_(o.float(), (w / total).unsqueeze(-1))
    return out.to(outs[0].dtype), lse
