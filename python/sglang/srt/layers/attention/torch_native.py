"""The reference attention backend (the oracle): torch SDPA over KV gathered from the pool.

Plain tensor ops and no device kernels, so that faster backends (`cpu_backend.py`) have something
simple to be checked against; it serves every model and mode, on any device:
- MHA (`forward`, batches that are not context-parallel), walked as `paged_metadata` describes the
  batch: the single-token requests (decodes) in ONE batched SDPA over their slots gathered from the
  pool, padded to the longest sequence and masked; each multi-token request in one SDPA, causal
  over its fresh k/v when it has no cached prefix, else over its whole sequence gathered from the
  pool under the causal mask offset by the prefix length.
- MLA / DSA (`forward_mla`): absorbed latent attention over the pool (`latent_attention.py`); with a
  Lightning Indexer the backend first runs its selection (`IndexerInputs.select`).
- Context parallelism: a batch that carries a `CPLayout` goes to `torch_native_cp.py` (MHA) or
  `mla_cp.py` (MLA, DSA); the early-exchange hooks (`start_kv_exchange`, `start_mla_exchange`)
  start their all-gathers.

Per-batch state is a `TorchNativeBatch` in `forward_batch.attn_metadata`, each member built on
first use (a model uses the MHA or the MLA members, a context-parallel batch the CP ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers.attention.base import AttentionBackend
from sglang.srt.layers.attention.kv_source import head_major_kv, kv_scales, widen_kv
from sglang.srt.layers.attention.latent_attention import dense_latent_attention, selected_latent_attention
from sglang.srt.layers.attention.mla_cp import mla_cp_forward, start_row_exchange
from sglang.srt.layers.attention.mla_cp_metadata import MLACPMetadata, build_mla_cp_metadata
from sglang.srt.layers.attention.ops import causal_mask
from sglang.srt.layers.attention.paged_metadata import PagedMetadata, build_paged_metadata
from sglang.srt.layers.attention.torch_native_cp import (
    CPAttnMetadata,
    build_cp_attn_metadata,
    cp_attention_forward,
    start_kv_exchange,
)
from sglang.srt.layers.context_parallel import CPLayout, get_cp_layout

if TYPE_CHECKING:
    from sglang.srt.layers.attention.dsa.indexer import IndexerInputs
    from sglang.srt.layers.attention.mla import MLACore
    from sglang.srt.layers.attention.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch import ForwardBatch


@dataclass
class TorchNativeBatch:
    """Per-batch state of the torch-native backends, shared by all layers (members built on first use)."""

    paged: Optional[PagedMetadata] = None  # a batch that is not context-parallel (MHA and MLA alike)
    mha_cp: Optional[CPAttnMetadata] = None  # context-parallel MHA
    mla_cp: Optional[MLACPMetadata] = None  # context-parallel MLA / DSA


class TorchNativeAttnBackend(AttentionBackend):
    """SDPA over KV gathered from the pool: the correctness reference for other backends."""

    name = "torch_native"
    supports_mha = True
    supports_mla = True
    supports_fp8_kv = True  # every read widens the pool's rows (`kv_source.widen_kv`)
    supports_context_parallel = True
    batch_state_type: ClassVar[type[TorchNativeBatch]] = TorchNativeBatch
    # CP: the FRESH requests' attention by a backend's fused kernels (None: the reference's)
    cp_fresh_attention: ClassVar[Optional[Callable[..., Optional[torch.Tensor]]]] = None

    def __init__(self, model_runner: object = None, **_: object):
        """Stateless: everything per batch lives in `forward_batch.attn_metadata`."""

    # ------------------------------------------------------------------ per-batch state
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        forward_batch.attn_metadata = self.batch_state_type()

    def _state(self, forward_batch: "ForwardBatch") -> TorchNativeBatch:
        """The batch's state (created here when `init_forward_metadata` was not called)."""
        state = forward_batch.attn_metadata
        if not isinstance(state, self.batch_state_type):
            self.init_forward_metadata(forward_batch)
            state = forward_batch.attn_metadata
        return state

    def _paged(self, forward_batch: "ForwardBatch") -> PagedMetadata:
        state = self._state(forward_batch)
        if state.paged is None:
            state.paged = build_paged_metadata(forward_batch)
        return state.paged

    def _mha_cp(self, forward_batch: "ForwardBatch", layout: CPLayout) -> CPAttnMetadata:
        state = self._state(forward_batch)
        if state.mha_cp is None:
            state.mha_cp = build_cp_attn_metadata(forward_batch, layout)
        return state.mha_cp

    def _mla_cp(self, forward_batch: "ForwardBatch", layout: CPLayout) -> MLACPMetadata:
        state = self._state(forward_batch)
        if state.mla_cp is None:
            state.mla_cp = build_mla_cp_metadata(forward_batch, layout)
        return state.mla_cp

    # ------------------------------------------------------------------ MHA
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        layout = get_cp_layout(forward_batch)
        if layout is not None:
            md = self._mha_cp(forward_batch, layout)
            return cp_attention_forward(
                q, k, v, layer, forward_batch, layout, md, save_kv_cache, self.cp_fresh_attention
            )
        return self._attend_local(q, k, v, layer, forward_batch, save_kv_cache)

    def start_kv_exchange(self, k, v, layer, forward_batch) -> None:
        """Context parallelism: start the async all-gather of the layer's new k/v."""
        layout = get_cp_layout(forward_batch)
        if layout is not None:
            start_kv_exchange(layout, layer.layer_id, k, v)

    def _attend_local(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: "RadixAttention",
        fb: "ForwardBatch",
        save_kv_cache: bool,
    ) -> torch.Tensor:
        """MHA of a batch that is not context-parallel: store k/v, then SDPA per request group."""
        n = q.shape[0]
        h, hk, d, dv = layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.v_head_dim
        if save_kv_cache:
            fb.token_to_kv_pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)
        if n == 0:
            return q.new_empty((0, h * dv))
        md = self._paged(fb)
        gqa = h != hk
        q3 = q.view(n, h, d)
        k_buf, v_buf = head_major_kv(fb.token_to_kv_pool, layer.layer_id)  # [Hk, rows, D]
        k_scale, v_scale = kv_scales(fb.token_to_kv_pool, layer.layer_id)
        out = q.new_empty((n, h, dv))
        if md.single_slots is not None:  # one query per request, keys padded to the longest
            n1, max_len = md.single_slots.shape
            idx = md.single_slots.reshape(-1)
            keys = widen_kv(
                k_buf.index_select(1, idx).view(hk, n1, max_len, d).transpose(0, 1), q.dtype, k_scale
            )
            values = widen_kv(
                v_buf.index_select(1, idx).view(hk, n1, max_len, dv).transpose(0, 1), q.dtype, v_scale
            )
            mask = None if md.single_valid is None else md.single_valid[:, None, None, :]
            qs = q3 if md.all_single else q3[md.single_token_idx]
            o = F.scaled_dot_product_attention(
                qs.unsqueeze(2), keys, values, attn_mask=mask, scale=layer.scaling, enable_gqa=gqa
            ).squeeze(2)
            if md.all_single:
                return o.reshape(n, h * dv)
            out[md.single_token_idx] = o
        k3, v3 = k.view(n, hk, d), v.view(n, hk, dv)
        for item in md.extends:
            s, e = item.start, item.end
            qi = q3[s:e].transpose(0, 1).unsqueeze(0)  # [1, H, m, D]: SDPA's flash kernel wants 4-D
            if item.prefix_len == 0:  # fresh prompt: its own k/v, causal
                ki, vi = k3[s:e].transpose(0, 1).unsqueeze(0), v3[s:e].transpose(0, 1).unsqueeze(0)
                o = F.scaled_dot_product_attention(
                    qi, ki, vi, is_causal=True, scale=layer.scaling, enable_gqa=gqa
                )
            else:  # whole sequence from the pool, causal mask offset by the cached prefix
                ks = widen_kv(k_buf.index_select(1, item.slots).unsqueeze(0), q.dtype, k_scale)
                vs = widen_kv(v_buf.index_select(1, item.slots).unsqueeze(0), q.dtype, v_scale)
                mask = causal_mask(e - s, item.seq_len, item.prefix_len, device=q.device)
                o = F.scaled_dot_product_attention(
                    qi, ks, vs, attn_mask=mask, scale=layer.scaling, enable_gqa=gqa
                )
            out[s:e] = o[0].transpose(0, 1)
        return out.view(n, h * dv)

    # ------------------------------------------------------------------ MLA / DSA
    def forward_mla(
        self,
        q: torch.Tensor,
        kv_new: torch.Tensor,
        layer: "MLACore",
        forward_batch: "ForwardBatch",
        indexer: Optional["IndexerInputs"] = None,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """q [n, H, L + R], kv_new [n, L + R] (rows of the new tokens) -> latent output [n, H, L]."""
        layout = get_cp_layout(forward_batch)
        if layout is not None:
            md = self._mla_cp(forward_batch, layout)
            return mla_cp_forward(layer, q, kv_new, forward_batch, layout, md, indexer, save_kv_cache)
        n = q.shape[0]
        if forward_batch.forward_mode.is_idle() or n == 0:
            return q.new_empty((n, layer.num_heads, layer.kv_lora_rank))
        topk = indexer.select(forward_batch, self._paged(forward_batch)) if indexer is not None else None
        if save_kv_cache:
            forward_batch.token_to_kv_pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, kv_new)
        return self.attend_latent(q, layer, forward_batch, topk)

    def attend_latent(
        self,
        q: torch.Tensor,
        layer: "MLACore",
        forward_batch: "ForwardBatch",
        topk_positions: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Latent attention of q over the layer's cached rows (the new ones already stored): dense,
        or over `topk_positions` [n, K] (positions in each token's sequence, -1 = none) for DSA."""
        pool = forward_batch.token_to_kv_pool
        kv = pool.get_key_buffer(layer.layer_id).squeeze(1)  # [rows, L + R], as stored
        scale = kv_scales(pool, layer.layer_id)[0]  # the latent row is key and value
        md = self._paged(forward_batch)
        if topk_positions is None:
            return dense_latent_attention(q, kv, layer.scaling, layer.kv_lora_rank, md, scale)
        table = forward_batch.req_to_token_pool.req_to_token
        return selected_latent_attention(
            q, kv, layer.scaling, layer.kv_lora_rank, md, table, topk_positions, scale
        )

    def start_mla_exchange(self, kv_new, layer, forward_batch, indexer=None) -> None:
        """Context parallelism: start the async all-gather of the layer's new latent rows (with the
        index keys appended for DSA) and the cached prefix rows this rank stores."""
        layout = get_cp_layout(forward_batch)
        if layout is None or layout.is_trivial:
            return
        rows = indexer.rows_with_key(kv_new) if indexer is not None else kv_new
        md = self._mla_cp(forward_batch, layout)
        start_row_exchange(forward_batch, layout, md, layer.layer_id, rows, indexer is not None)
