"""Softmax attention that also returns the log-sum-exp (LSE) of the scaled scores.

Attention over one query set split into disjoint key sets (a cached prefix and a chunk, the KV
shards of context-parallel ranks, runs of a long decode) is recovered exactly from the partial
results and their LSEs (`merge.merge_state`).

- `attention_with_lse`: the exact float32 math version (any device, any mask).
- `sdpa_lse`: 4-D SDPA returning (out, lse); on CPU torch's flash kernel
  (`_scaled_dot_product_flash_attention_for_cpu`, via `platforms/kernel_dispatch.flash_lse_op`), elsewhere
  `attention_with_lse`.

A query that sees no key gets out = 0 and lse = -inf, so it drops out of a merge.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.platforms.kernel_dispatch import flash_lse_op
from sglang.srt.layers.attention.ops.mask import causal_mask


def attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    attn_mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax attention with the log-sum-exp of the scaled scores.

    q [..., Hq, Lq, D], k/v [..., Hk, Lk, D] with Hq a multiple of Hk (GQA); `attn_mask` is a bool
    mask broadcastable to [..., Hq, Lq, Lk] (True = attend); `is_causal` is top-left aligned like
    SDPA's. Returns (out [..., Hq, Lq, Dv] in q's dtype, lse [..., Hq, Lq] float32).
    """
    hq, hk = q.shape[-3], k.shape[-3]
    if hq != hk:
        k = k.repeat_interleave(hq // hk, dim=-3)
        v = v.repeat_interleave(hq // hk, dim=-3)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if is_causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
        attn_mask = mask if attn_mask is None else attn_mask & mask
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - safe_lse.unsqueeze(-1))
    out = torch.matmul(probs, v.float())
    return out.to(q.dtype), lse


def lse_kernel_available(q: torch.Tensor) -> bool:
    """Whether `sdpa_lse` runs on torch's CPU flash kernel for q. Only then do attention paths
    split over key sets pay off; elsewhere the exact-math fallback is slower than one SDPA over
    gathered keys."""
    return flash_lse_op(q) is not None


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
