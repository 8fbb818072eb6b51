"""AttentionBackend: the interface every attention implementation provides."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Optional

import torch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.dsa.indexer import IndexerInputs
    from sglang.srt.layers.attention.mla import MLACore
    from sglang.srt.layers.attention.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    """Paged attention over the KV pool.

    Per forward pass the model runner calls `init_forward_metadata(forward_batch)` once; each
    attention layer then calls `forward(q, k, v, layer, forward_batch)` (plain multi-head / GQA
    attention, `RadixAttention`) or `forward_mla(q, kv_new, layer, forward_batch, indexer)`
    (absorbed latent attention, `MLACore`).

    Semantics: the new tokens of request i have absolute positions
    `extend_prefix_lens[i] .. seq_lens[i] - 1`. The backend stores the new k/v at `out_cache_loc`
    (unless `save_kv_cache` is False) and attends each query causally over the request's whole
    sequence, whose KV slots are `req_to_token[req_pool_indices[i], :seq_lens[i]]`. A batch that
    carries a context-parallel layout (`forward_batch.cp_layout`) holds only this rank's tokens;
    a backend that `supports_context_parallel` runs it sharded (layers do not branch on CP).

    Shapes: q [num_tokens, num_heads * head_dim] (or [num_tokens, num_heads, head_dim]);
    k, v [num_tokens, num_kv_heads * head_dim]; returns [num_tokens, num_heads * v_head_dim].
    Backend-private per-batch state lives in `forward_batch.attn_metadata` (an object of the
    backend's own type), never on the backend, so several batches (pipeline micro-batches) can be
    in flight with one backend.

    Capabilities are class attributes, read at start-up to check the model / flags pairing
    (`registry.check_attention_backend`): `supports_mha` (`forward`), `supports_mla`
    (`forward_mla`), `supports_context_parallel`, `supports_fp8_kv` (reads a 1-byte FP8 pool,
    `--kv-cache-dtype fp8_*`, widening the rows with the layer's scales).
    """

    name: ClassVar[str] = "base"
    supports_mha: ClassVar[bool] = True
    supports_mla: ClassVar[bool] = False
    supports_context_parallel: ClassVar[bool] = False
    supports_fp8_kv: ClassVar[bool] = False

    @abstractmethod
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        """Set `forward_batch.attn_metadata` to this backend's per-batch object (index tensors,
        masks, shared by all layers)."""

    @abstractmethod
    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: "RadixAttention",
        forward_batch: "ForwardBatch",
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """Attention for EXTEND / MIXED batches."""

    @abstractmethod
    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: "RadixAttention",
        forward_batch: "ForwardBatch",
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """Attention for DECODE batches (one new token per request)."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: "RadixAttention",
        forward_batch: "ForwardBatch",
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        mode = forward_batch.forward_mode
        if mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        if mode.is_idle():
            return q.new_empty((0, layer.num_heads * layer.v_head_dim))
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    def start_kv_exchange(
        self, k: torch.Tensor, v: torch.Tensor, layer: "RadixAttention", forward_batch: "ForwardBatch"
    ) -> None:
        """Hook called as soon as a layer's new k (rotated) and v exist, before `forward`: a
        context-parallel backend starts moving them here (an async all-gather overlapping the
        query's rope). No-op by default."""

    def forward_mla(
        self,
        q: torch.Tensor,
        kv_new: torch.Tensor,
        layer: "MLACore",
        forward_batch: "ForwardBatch",
        indexer: Optional["IndexerInputs"] = None,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """Absorbed latent attention (MLA; DSA when `indexer` is given, which the backend runs to
        select each query's keys): q [n, H, L + R] latent queries, kv_new [n, L + R] the new
        tokens' cached rows [latent ; k_rope] -> [n, H, L]."""
        raise NotImplementedError(
            f"attention backend {self.name!r} has no latent attention (MLA); pick one that supports it"
        )

    def start_mla_exchange(
        self,
        kv_new: torch.Tensor,
        layer: "MLACore",
        forward_batch: "ForwardBatch",
        indexer: Optional["IndexerInputs"] = None,
    ) -> None:
        """Hook called as soon as an MLA layer's new latent rows exist, before its query
        projections: a context-parallel backend starts moving the rows here. No-op by default."""
