"""Triton implementation of the DSA ops (CUDA, triton-ascend; on CPU under TRITON_INTERPRET=1, which
must be set before this module is imported: `triton.jit` reads it when the kernels are defined).

- `indexer_topk`: `_index_logits` scores a block of queries against their request's keys read
  through the block table (q [heads x dim] . k^T with tl.dot, relu, head-weighted sum, causal
  -inf), into a [queries x keys] logits block; the top-k is then taken with torch (stable sort:
  ties to the earlier position, like the reference). Query blocks are sized so a logits block
  stays under LOGITS_BUDGET elements: memory never holds all queries x all keys.
- `sparse_attention`: one program per (query, head block): the selected rows are gathered
  BLOCK_K at a time through the block table, q . k (+ q_rope . k_rope) with tl.dot, online
  softmax, p . v with tl.dot; output and log-sum-exp.
- `merge_attn_states`: one program per row, the partials stacked [P, rows, D].

float32 accumulation throughout (tl.dot with input_precision "ieee" for float32 inputs).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from sgl_kernel_npu.layouts import PagedKeys, Queries
from sgl_kernel_npu.reference import quantize_int8, select_topk

LOGITS_BUDGET = 1 << 24


def _p2(x: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(int(x)))


@triton.jit
def _index_logits(
    q_ptr,
    w_ptr,
    k_ptr,
    bt_ptr,
    batch_ptr,
    kvend_ptr,
    out_ptr,
    t_base,
    stride_qt,
    stride_qh,
    stride_k,
    stride_bt,
    stride_out,
    n_heads,
    dim,
    block_size,
    s_max,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0)
    sb = tl.program_id(1)
    t = t_base + row
    b = tl.load(batch_ptr + t)
    kv_end = tl.load(kvend_ptr + t)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_s = sb * BLOCK_S + tl.arange(0, BLOCK_S)
    hmask = offs_h < n_heads
    dmask = offs_d < dim
    smask = offs_s < kv_end
    q = tl.load(
        q_ptr + t * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :],
        mask=hmask[:, None] & dmask[None, :],
        other=0.0,
    ).to(tl.float32)
    w = tl.load(w_ptr + t * n_heads + offs_h, mask=hmask, other=0.0)
    blk = tl.load(bt_ptr + b * stride_bt + offs_s // block_size, mask=smask, other=0)
    rows = blk.to(tl.int64) * block_size + offs_s % block_size
    k = tl.load(
        k_ptr + rows[:, None] * stride_k + offs_d[None, :], mask=smask[:, None] & dmask[None, :], other=0.0
    ).to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision="ieee")  # [H, S]
    s = tl.maximum(s, 0.0) * w[:, None]
    score = tl.sum(s, axis=0)
    score = tl.where(smask, score, float("-inf"))
    tl.store(out_ptr + row * stride_out + offs_s, score, mask=offs_s < s_max)


def indexer_topk(
    qs: Queries, weights: torch.Tensor, keys: PagedKeys, k: int, score_dtype: Optional[torch.dtype] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    q = qs.q if qs.q.stride(-1) == 1 else qs.q.contiguous()
    if score_dtype == torch.bfloat16:  # bf16-rounded inputs; the kernel widens them (exact products)
        q = q.to(torch.bfloat16)
        keys = PagedKeys(keys.rows.to(torch.bfloat16), keys.block_table, keys.block_size, keys.kv_lens)
    if score_dtype == torch.int8 or keys.scale is not None:
        # the reference's quantization; query scales into the weights, the keys dequantized (float32
        # products of the int8 values: the int8 scores up to float32 rounding)
        q8, q_scale = quantize_int8(q)
        q, weights = q8.float(), weights.float() * q_scale
        k8, k_scale = (keys.rows, keys.scale) if keys.scale is not None else quantize_int8(keys.rows)
        rows = k8.float() * k_scale.float().unsqueeze(-1)
        keys = PagedKeys(rows, keys.block_table, keys.block_size, keys.kv_lens)
    t_total, heads, dim = q.shape
    dev = q.device
    out_idx = torch.full((t_total, k), -1, dtype=torch.int32, device=dev)
    out_val = torch.full((t_total, k), float("-inf"), dtype=torch.float32, device=dev)
    if t_total == 0:
        return out_idx, out_val
    rows = keys.rows if keys.rows.stride(-1) == 1 else keys.rows.contiguous()
    w = weights.float().contiguous()
    table = keys.block_table.to(torch.int32).contiguous()
    batch = qs.batch.to(torch.int32).contiguous()
    kv_end = qs.kv_end.to(torch.int32).contiguous()
    s_max = max(1, int(kv_end.max()))
    block_s = 64
    step = max(1, LOGITS_BUDGET // s_max)
    for t0 in range(0, t_total, step):
        t1 = min(t_total, t0 + step)
        logits = torch.empty((t1 - t0, s_max), dtype=torch.float32, device=dev)
        grid = (t1 - t0, triton.cdiv(s_max, block_s))
        _index_logits[grid](
            q,
            w,
            rows,
            table,
            batch,
            kv_end,
            logits,
            t0,
            q.stride(0),
            q.stride(1),
            rows.stride(0),
            table.stride(0),
            logits.stride(0),
            heads,
            dim,
            keys.block_size,
            s_max,
            BLOCK_H=_p2(heads),
            BLOCK_D=_p2(dim),
            BLOCK_S=block_s,
        )
        vals, idx = select_topk(logits, k)
        out_idx[t0:t1] = idx.to(torch.int32)
        out_val[t0:t1] = vals
    return out_idx, out_val


@triton.jit
def _head_rows(ptr, t, stride_t, stride_h, offs_h, hmask, offs_d, d):
    """Token t's rows of the heads offs_h (columns < d, masked heads 0), widened to float32."""
    return tl.load(
        ptr + t * stride_t + offs_h[:, None] * stride_h + offs_d[None, :],
        mask=hmask[:, None] & (offs_d[None, :] < d),
        other=0.0,
    ).to(tl.float32)


@triton.jit
def _pool_rows(ptr, rows, stride, valid, offs_d, d):
    """The pool's rows `rows` (columns < d, invalid rows 0), widened to float32."""
    return tl.load(
        ptr + rows[:, None] * stride + offs_d[None, :],
        mask=valid[:, None] & (offs_d[None, :] < d),
        other=0.0,
    ).to(tl.float32)


@triton.jit
def _sparse_attn(
    q_ptr,
    qr_ptr,
    k_ptr,
    kr_ptr,
    v_ptr,
    bt_ptr,
    batch_ptr,
    limit_ptr,
    idx_ptr,
    out_ptr,
    lse_ptr,
    stride_qt,
    stride_qh,
    stride_qrt,
    stride_qrh,
    stride_k,
    stride_kr,
    stride_v,
    stride_bt,
    stride_idx,
    n_heads,
    dk,
    dr,
    dv,
    topk,
    block_size,
    scale,
    HAS_ROPE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    t = tl.program_id(0)
    hb = tl.program_id(1)
    b = tl.load(batch_ptr + t)
    limit = tl.load(limit_ptr + t)
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = offs_h < n_heads
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dr = tl.arange(0, BLOCK_DR)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = _head_rows(q_ptr, t, stride_qt, stride_qh, offs_h, hmask, offs_dk, dk)
    if HAS_ROPE:
        qr = _head_rows(qr_ptr, t, stride_qrt, stride_qrh, offs_h, hmask, offs_dr, dr)
    m = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_DV), dtype=tl.float32)
    for k0 in range(0, topk, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        pos = tl.load(idx_ptr + t * stride_idx + offs_k, mask=offs_k < topk, other=-1)
        valid = (pos >= 0) & (pos < limit)
        safe = tl.where(valid, pos, 0)
        blk = tl.load(bt_ptr + b * stride_bt + safe // block_size, mask=valid, other=0)
        rows = blk.to(tl.int64) * block_size + safe % block_size
        k = _pool_rows(k_ptr, rows, stride_k, valid, offs_dk, dk)
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
        if HAS_ROPE:
            kr = _pool_rows(kr_ptr, rows, stride_kr, valid, offs_dr, dr)
            s += tl.dot(qr, tl.trans(kr), input_precision="ieee")
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = _pool_rows(v_ptr, rows, stride_v, valid, offs_dv, dv)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m = m_new
    has = l > 0
    out = acc / tl.where(has, l, 1.0)[:, None]
    lse = tl.where(has, m + tl.log(tl.where(has, l, 1.0)), float("-inf"))
    tl.store(
        out_ptr + t * n_heads * dv + offs_h[:, None] * dv + offs_dv[None, :],
        out,
        mask=hmask[:, None] & (offs_dv[None, :] < dv),
    )
    tl.store(lse_ptr + t * n_heads + offs_h, lse, mask=hmask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


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
) -> tuple[torch.Tensor, torch.Tensor]:
    t_total, heads, dk = q.shape
    dv = value.shape[-1]
    out = torch.zeros((t_total, heads, dv), dtype=torch.float32, device=q.device)
    lse = torch.full((t_total, heads), float("-inf"), dtype=torch.float32, device=q.device)
    topk = indices.shape[1]
    if t_total == 0 or topk == 0:
        return out.to(q.dtype), lse
    q = _rows(q)
    kr_rows = _rows(key_rope) if key_rope is not None else None
    qr = _rows(q_rope) if q_rope is not None else None
    has_rope = qr is not None
    dr = qr.shape[-1] if has_rope else 1
    k_rows, v_rows = _rows(key.rows), _rows(value)
    table = key.block_table.to(torch.int32).contiguous()
    idx = indices.to(torch.int32).contiguous()
    block_h = 16
    grid = (t_total, triton.cdiv(heads, block_h))
    _sparse_attn[grid](
        q,
        qr if has_rope else q,
        k_rows,
        kr_rows if has_rope else k_rows,
        v_rows,
        table,
        batch.to(torch.int32).contiguous(),
        limit.to(torch.int32).contiguous(),
        idx,
        out,
        lse,
        q.stride(0),
        q.stride(1),
        qr.stride(0) if has_rope else 0,
        qr.stride(1) if has_rope else 0,
        k_rows.stride(0),
        kr_rows.stride(0) if has_rope else 0,
        v_rows.stride(0),
        table.stride(0),
        idx.stride(0),
        heads,
        dk,
        dr,
        dv,
        topk,
        key.block_size,
        float(scale),
        HAS_ROPE=has_rope,
        BLOCK_H=block_h,
        BLOCK_DK=_p2(dk),
        BLOCK_DR=_p2(dr),
        BLOCK_DV=_p2(dv),
        BLOCK_K=32,
    )
    return out.to(q.dtype), lse


@triton.jit
def _merge(out_ptr, lse_ptr, outs_ptr, lses_ptr, rows, dim, PARTS: tl.constexpr, BLOCK_D: tl.constexpr):
    r = tl.program_id(0)
    offs = tl.arange(0, BLOCK_D)
    m = tl.load(lses_ptr + r)
    for p in tl.static_range(1, PARTS):
        m = tl.maximum(m, tl.load(lses_ptr + p * rows + r))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.exp(tl.load(lses_ptr + r) - m_safe)
    for p in tl.static_range(1, PARTS):
        total += tl.exp(tl.load(lses_ptr + p * rows + r) - m_safe)
    denom = tl.where(total == 0.0, 1.0, total)
    for d0 in range(0, dim, BLOCK_D):
        dmask = d0 + offs < dim
        acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
        for p in tl.static_range(PARTS):
            wgt = tl.exp(tl.load(lses_ptr + p * rows + r) - m_safe) / denom
            acc += wgt * tl.load(outs_ptr + (p * rows + r) * dim + d0 + offs, mask=dmask, other=0.0)
        tl.store(out_ptr + r * dim + d0 + offs, acc, mask=dmask)
    tl.store(lse_ptr + r, m_safe + tl.log(total))


def merge_attn_states(
    outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    shape, dim = lses[0].shape, outs[0].shape[-1]
    o = torch.stack([x.float().reshape(-1, dim) for x in outs]).contiguous()
    ls = torch.stack([x.float().reshape(-1) for x in lses]).contiguous()
    rows = ls.shape[1]
    out = torch.empty((rows, dim), dtype=torch.float32, device=o.device)
    lse = torch.empty((rows,), dtype=torch.float32, device=o.device)
    if rows:
        _merge[(rows,)](out, lse, o, ls, rows, dim, PARTS=len(outs), BLOCK_D=min(_p2(dim), 256))
    return out.view(*shape, dim).to(outs[0].dtype), lse.view(shape)
