"""Reference latent-attention backend (MLA dense, DSA sparse) on torch ops; also serves plain attention.

`forward_mla(q, kv_new, layer, forward_batch, topk_positions)` runs *absorbed* MLA: every head's query
is already in latent space (`q = [q_nope · W_UK ; q_rope]`, dim kv_lora_rank + qk_rope_head_dim), the
single shared key is the cached row `[latent ; k_rope]` and the value is its latent part. That is
multi-query attention with one KV head, so the heads are folded into the query rows (decode) or
attend one broadcast key head (prefill); nothing is up-projected per head.

- dense: decode requests in one batched SDPA over padded slots; each multi-token request in one
  SDPA over its whole sequence (causal, offset by its cached prefix). The value passed to SDPA is
  the whole row (its first kv_lora_rank outputs are kept): equal head sizes let torch take its
  flash kernel on CPU instead of materialising [heads x queries x keys] scores.
- sparse (DSA, `topk_positions` given): each query attends to the positions its indexer chose,
  gathered per query (`dsa.sparse_attention`).

Registered as `torch_native_mla`; it inherits `TorchNativeAttnBackend` so non-MLA models run on it
unchanged. MLA layers fall back to their own instance when the batch's backend has no `forward_mla`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers.attention.dsa.sparse_attention import sparse_latent_attention
from sglang.srt.layers.attention.mla_metadata import MLAMetadata, get_mla_metadata
from sglang.srt.layers.attention.torch_native import TorchNativeAttnBackend, causal_mask

if TYPE_CHECKING:
    from sglang.srt.layers.attention.mla import MLACore
    from sglang.srt.model_executor.forward_batch import ForwardBatch


class TorchNativeMLABackend(TorchNativeAttnBackend):
    name = "torch_native_mla"

    def forward_mla(
        self,
        q: torch.Tensor,
        kv_new: torch.Tensor,
        layer: "MLACore",
        forward_batch: "ForwardBatch",
        topk_positions: Optional[torch.Tensor] = None,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """q [n, H, L + R], kv_new [n, L + R] (rows of the new tokens) -> latent output [n, H, L]."""
        n = q.shape[0]
        if forward_batch.forward_mode.is_idle() or n == 0:
            return q.new_empty((n, layer.num_heads, layer.kv_lora_rank))
        pool = forward_batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, kv_new)
        kv = pool.get_key_buffer(layer.layer_id).squeeze(1)  # [rows, L + R]
        md = get_mla_metadata(forward_batch)
        if topk_positions is not None:
            return self._sparse(q, kv, layer, forward_batch, md, topk_positions)
        return self._dense(q, kv, layer, md)

    @staticmethod
    def _dense(q: torch.Tensor, kv: torch.Tensor, layer: "MLACore", md: MLAMetadata) -> torch.Tensor:
        n, num_heads, dim = q.shape
        v_dim = layer.kv_lora_rank
        out = q.new_empty((n, num_heads, v_dim))
        if md.single_slots is not None:
            qs = q if md.all_single else q[md.single_token_idx]
            n1, max_len = md.single_slots.shape
            keys = kv.index_select(0, md.single_slots.reshape(-1)).view(n1, 1, max_len, dim).to(q.dtype)
            mask = None if md.single_valid is None else md.single_valid[:, None, None, :]
            # one query per request: its heads are the query rows of a single-KV-head attention
            o = F.scaled_dot_product_attention(qs.unsqueeze(1), keys, keys, attn_mask=mask, scale=layer.scaling)
            o = o.squeeze(1)[..., :v_dim]
            if md.all_single:
                return o
            out[md.single_token_idx] = o
        for item in md.extends:
            qi = q[item.start : item.end].transpose(0, 1).unsqueeze(0)  # [1, H, m, D]
            keys = kv.index_select(0, item.slots).view(1, 1, item.seq_len, dim).to(q.dtype)
            m = item.end - item.start
            fresh = item.prefix_len == 0
            mask = None if fresh else causal_mask(m, item.seq_len, item.prefix_len, device=q.device)
            o = F.scaled_dot_product_attention(
                qi, keys, keys, attn_mask=mask, is_causal=fresh, scale=layer.scaling, enable_gqa=True
            )
            out[item.start : item.end] = o[0, ..., :v_dim].transpose(0, 1)
        return out

    @staticmethod
    def _sparse(
        q: torch.Tensor,
        kv: torch.Tensor,
        layer: "MLACore",
        fb: "ForwardBatch",
        md: MLAMetadata,
        topk_positions: torch.Tensor,
    ) -> torch.Tensor:
        """topk_positions [n, K]: positions in each token's own sequence, -1 for none."""
        req_to_token = fb.req_to_token_pool.req_to_token
        valid = topk_positions >= 0
        slots = req_to_token[md.token_req_rows.unsqueeze(1), topk_positions.clamp(min=0)]
        slots = slots.masked_fill(~valid, 0)
        return sparse_latent_attention(q, kv, slots, valid, layer.scaling, layer.kv_lora_rank)
