"""KV cache of Multi-head Latent Attention (DeepSeek V2/V3) and of DeepSeek Sparse Attention (V3.2).

MLA caches one compressed row per token and layer instead of per-head keys and values:
`[kv_lora_rank latent ; qk_rope_head_dim roped key]` (576 values for DeepSeek-V3). Every head's key
and value are recovered from it by the (absorbed) kv_b_proj weights, so the row is the same on every
attention-TP rank. The DSA pool adds the Lightning Indexer's key (`index_head_dim` values) per token
and layer; the reference stores it in FP8 with a scale, here it is kept in the pool dtype, and with
`index_k_int8` (int8 index scoring, `SGLANG_DSA_INDEX_SCORE_DTYPE=int8`) also as symmetric int8
rows with one float32 scale per token, quantized once when written (what the `dsa` backend's
int8 indexer reads; the pool-dtype rows stay for the other readers: CP gathers, the reference
indexer).

With `kv_dtype` FP8 (`--kv-cache-dtype fp8_*`) the latent rows are stored in 1 byte as
`fp8(row / k_scale)` of their layer (`kv_pool.quantize_kv`; the value is part of the same row, so
only the key scale applies); the indexer keys stay in the model dtype.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from sglang.srt.mem_cache.kv_pool import KVPool, quantize_kv


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class MLATokenToKVPool(KVPool):
    """kv_buffer[i]: [size + page_size, 1, kv_lora_rank + qk_rope_head_dim].

    `get_key_buffer` is the whole row (the key of absorbed attention), `get_value_buffer` a view of
    its first `kv_lora_rank` values (the value of absorbed attention)."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: Union[str, torch.device] = "cpu",
        start_layer: int = 0,
        kv_dtype: Optional[torch.dtype] = None,
    ):
        super().__init__(size, page_size, dtype, layer_num, device, start_layer, kv_dtype)
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        rows = size + page_size
        self.kv_buffer = [self._zeros(rows, 1, self.kv_cache_dim) for _ in range(layer_num)]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[self._local(layer_id)]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[self._local(layer_id)][..., : self.kv_lora_rank]

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: Optional[torch.Tensor] = None
    ) -> None:
        """Write whole latent rows: `cache_k` [n, kv_cache_dim] (or [n, 1, kv_cache_dim]).

        `cache_v` is ignored: the value is the first kv_lora_rank values of the same row."""
        i = self._local(layer_id)
        row = quantize_kv(
            cache_k.reshape(cache_k.shape[0], 1, self.kv_cache_dim), self.dtype, self.k_scale[i]
        )
        buf = self.kv_buffer[i].view(self._store_view)  # bytes for FP8 (see KVPool)
        buf[loc.to(device=self.device, dtype=torch.int64)] = row.view(self._store_view)

    def round_as_stored(self, layer_id: int, rows: torch.Tensor) -> torch.Tensor:
        """Latent rows [n, kv_cache_dim] as a read of them after `set_kv_buffer` returns them
        (widened to `rows`' dtype): unchanged unless the pool stores FP8, which rounds them."""
        if not self.is_fp8:
            return rows
        scale = self.k_scale[self._local(layer_id)]
        out = quantize_kv(rows, self.dtype, scale).to(rows.dtype)
        return out if scale == 1.0 else out * scale

    def set_mla_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, latent: torch.Tensor, k_rope: torch.Tensor
    ) -> None:
        """Write latent [n, kv_lora_rank] and roped key [n, qk_rope_head_dim] of new tokens."""
        self.set_kv_buffer(layer_id, loc, torch.cat((latent, k_rope.reshape(latent.shape[0], -1)), dim=-1))

    def mem_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.kv_buffer)

    @staticmethod
    def cell_size_bytes(kv_lora_rank: int, qk_rope_head_dim: int, layer_num: int, dtype: torch.dtype) -> int:
        """Bytes per token across `layer_num` layers."""
        return (kv_lora_rank + qk_rope_head_dim) * layer_num * _itemsize(dtype)


class DSATokenToKVPool(MLATokenToKVPool):
    """MLA pool plus index_k_buffer[i]: [size + page_size, index_head_dim] (Lightning Indexer keys);
    with `index_k_int8` also index_k_int8[i] (int8, same shape) and index_k_scale[i] [size + page_size]
    float32 (`sgl_kernel_npu.reference.quantize_int8` of each row)."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        index_head_dim: int,
        layer_num: int,
        device: Union[str, torch.device] = "cpu",
        start_layer: int = 0,
        index_k_int8: bool = False,
        kv_dtype: Optional[torch.dtype] = None,
    ):
        super().__init__(
            size, page_size, dtype, kv_lora_rank, qk_rope_head_dim, layer_num, device, start_layer, kv_dtype
        )
        self.index_head_dim = index_head_dim
        rows = size + page_size
        self.index_k_buffer = [self._zeros(rows, index_head_dim, dtype=dtype) for _ in range(layer_num)]
        n8 = layer_num if index_k_int8 else 0
        self.index_k_int8 = [self._zeros(rows, index_head_dim, dtype=torch.int8) for _ in range(n8)]
        self.index_k_scale = [self._zeros(rows, dtype=torch.float32) for _ in range(n8)]

    def get_index_k_buffer(self, layer_id: int) -> torch.Tensor:
        return self.index_k_buffer[self._local(layer_id)]

    def get_index_k_int8(self, layer_id: int) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """(int8 rows [rows, index_head_dim], scales [rows]) of the int8 copy, or None without one."""
        if not self.index_k_int8:
            return None
        i = self._local(layer_id)
        return self.index_k_int8[i], self.index_k_scale[i]

    def set_index_k_buffer(self, layer_id: int, loc: torch.Tensor, index_k: torch.Tensor) -> None:
        """Write the indexer keys [n, index_head_dim] of new tokens (and their int8 copy)."""
        i, loc = self._local(layer_id), loc.to(device=self.device, dtype=torch.int64)
        self.index_k_buffer[i][loc] = index_k.to(self.compute_dtype)
        if self.index_k_int8:
            from sgl_kernel_npu.reference import quantize_int8

            # from the stored rows: what an indexer reading the pool-dtype cache would quantize
            k8, scale = quantize_int8(self.index_k_buffer[i][loc])
            self.index_k_int8[i][loc] = k8
            self.index_k_scale[i][loc] = scale

    def mem_bytes(self) -> int:
        bufs = self.index_k_buffer + self.index_k_int8 + self.index_k_scale
        return super().mem_bytes() + sum(b.numel() * b.element_size() for b in bufs)

    @staticmethod
    def cell_size_bytes(  # type: ignore[override]
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        dtype: torch.dtype,
        index_head_dim: int = 0,
        index_k_int8: bool = False,
        kv_dtype: Optional[torch.dtype] = None,
    ) -> int:
        """Bytes per token: latent rows in `kv_dtype` (default `dtype`), indexer keys in `dtype`."""
        int8_copy = (index_head_dim + 4) * layer_num if index_k_int8 and index_head_dim else 0
        latent = (kv_lora_rank + qk_rope_head_dim) * layer_num * _itemsize(kv_dtype or dtype)
        return latent + index_head_dim * layer_num * _itemsize(dtype) + int8_copy
