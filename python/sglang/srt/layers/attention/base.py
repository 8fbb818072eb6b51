"""AttentionBackend: the interface every attention implementation provides."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    """Paged attention over the KV pool.

    Per forward pass the model runner calls `init_forward_metadata(forward_batch)` once; each
    attention layer then calls `forward(q, k, v, layer, forward_batch)`.

    Semantics: the new tokens of request i have absolute positions
    `extend_prefix_lens[i] .. seq_lens[i] - 1`. The backend stores the new k/v at `out_cache_loc`
    (unless `save_kv_cache` is False) and attends each query causally over the request's whole
    sequence, whose KV slots are `req_to_token[req_pool_indices[i], :seq_lens[i]]`.

    Shapes: q [num_tokens, num_heads * head_dim] (or [num_tokens, num_heads, head_dim]);
    k, v [num_tokens, num_kv_heads * head_dim]; returns [num_tokens, num_heads * v_head_dim].
    Backend-private per-batch state lives in `forward_batch.attn_metadata`, never on the backend,
    so several batches (pipeline micro-batches) can be in flight with one backend.
    """

    name: str = "base"

    @abstractmethod
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        """Build the per-batch metadata shared by all layers (index tensors, masks)."""

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
