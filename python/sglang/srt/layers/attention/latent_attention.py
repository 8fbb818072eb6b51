"""Absorbed latent attention (MLA dense, DSA sparse) over the paged pool: the torch-native math.

Every head's query is already in latent space (`q = [q_nope · W_UK ; q_rope]`, dim kv_lora_rank +
qk_rope_head_dim), the single shared key is the cached row `[latent ; k_rope]` and the value is its
latent part. That is multi-query attention with one KV head, so the heads are folded into the query
rows (decode) or attend one broadcast key head (prefill); nothing is up-projected per head.

- `dense_latent_attention`: decode requests in one batched SDPA over padded slots; each multi-token
  request in one SDPA over its whole sequence (causal, offset by its cached prefix). The value
  passed to SDPA is the whole row (its first kv_lora_rank outputs are kept): equal head sizes let
  torch take its flash kernel on CPU instead of materialising [heads x queries x keys] scores.
- `selected_latent_attention` (DSA): each query attends to the positions its indexer chose,
  gathered per query (`dsa.sparse_attention`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang.srt.layers.attention.dsa.sparse_attention import sparse_latent_attention
from sglang.srt.layers.attention.kv_source import widen_kv
from sglang.srt.layers.attention.ops import causal_mask
from sglang.srt.layers.attention.paged_metadata import PagedMetadata


def dense_latent_attention(
    q: torch.Tensor, kv: torch.Tensor, scale: float, v_dim: int, md: PagedMetadata, kv_scale: float = 1.0
) -> torch.Tensor:
    """q [n, H, L + R] absorbed queries, kv [rows, L + R] the layer's latent cache (new rows
    stored; widened to q's dtype times `kv_scale` as read) -> [n, H, v_dim]."""
    n, num_heads, dim = q.shape
    out = q.new_empty((n, num_heads, v_dim))
    if md.single_slots is not None:
        qs = q if md.all_single else q[md.single_token_idx]
        n1, max_len = md.single_slots.shape
        keys = widen_kv(
            kv.index_select(0, md.single_slots.reshape(-1)).view(n1, 1, max_len, dim), q.dtype, kv_scale
        )
        mask = None if md.single_valid is None else md.single_valid[:, None, None, :]
        # one query per request: its heads are the query rows of a single-KV-head attention
        o = F.scaled_dot_product_attention(qs.unsqueeze(1), keys, keys, attn_mask=mask, scale=scale)
        o = o.squeeze(1)[..., :v_dim]
        if md.all_single:
            return o
        out[md.single_token_idx] = o
    for item in md.extends:
        qi = q[item.start : item.end].transpose(0, 1).unsqueeze(0)  # [1, H, m, D]
        keys = widen_kv(kv.index_select(0, item.slots).view(1, 1, item.seq_len, dim), q.dtype, kv_scale)
        m = item.end - item.start
        fresh = item.prefix_len == 0
        mask = None if fresh else causal_mask(m, item.seq_len, item.prefix_len, device=q.device)
        o = F.scaled_dot_product_attention(
            qi, keys, keys, attn_mask=mask, is_causal=fresh, scale=scale, enable_gqa=True
        )
        out[item.start : item.end] = o[0, ..., :v_dim].transpose(0, 1)
    return out


def selected_latent_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    scale: float,
    v_dim: int,
    md: PagedMetadata,
    req_to_token: torch.Tensor,
    topk_positions: torch.Tensor,
    kv_scale: float = 1.0,
) -> torch.Tensor:
    """DSA: topk_positions [n, K] are positions in each token's own sequence, -1 for none."""
    valid = topk_positions >= 0
    slots = req_to_token[md.token_req_rows.unsqueeze(1), topk_positions.clamp(min=0)]
    slots = slots.masked_fill(~valid, 0)
    return sparse_latent_attention(q, kv, slots, valid, scale, v_dim, kv_scale=kv_scale)
