"""RadixAttention: the attention layer a model holds; the math is done by the batch's backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch import ForwardBatch


class RadixAttention(nn.Module):
    """Per-layer attention description (local head counts, scale, global layer id).

    `num_heads` / `num_kv_heads` are the heads held by this tp rank; `layer_id` is the global layer
    index used to address the KV pool.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scaling: float,
        num_kv_heads: int,
        layer_id: int,
        v_head_dim: Optional[int] = None,
    ):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.scaling = scaling
        self.num_kv_heads = num_kv_heads
        self.layer_id = layer_id

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        forward_batch: "ForwardBatch",
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache)

    def start_kv_exchange(self, k: torch.Tensor, v: torch.Tensor, forward_batch: "ForwardBatch") -> None:
        """Let the backend start moving this layer's new k/v early (context parallelism: an async
        all-gather overlapping the query's rope); a no-op for backends that do not need it."""
        forward_batch.attn_backend.start_kv_exchange(k, v, self, forward_batch)

    def extra_repr(self) -> str:
        return (
            f"layer_id={self.layer_id}, heads={self.num_heads}, kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, scaling={self.scaling:.4g}"
        )
