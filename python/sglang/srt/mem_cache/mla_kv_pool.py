"""KV cache of Multi-head Latent Attention (DeepSeek V2/V3) and of DeepSeek Sparse Attention (V3.2).

MLA caches one compressed row per token and layer instead of per-head keys and values:
`[kv_lora_rank latent ; qk_rope_head_dim roped key]` (576 values for DeepSeek-V3). Every head's key
and value are recovered from it by the (absorbed) kv_b_proj weights, so the row is the same on every
attention-TP rank. The DSA pool adds the Lightning Indexer's key (`index_head_dim` values) per
token and layer, in the model dtype, or in FP8 (below); with `index_k_int8` (int8 index scoring,
`SGLANG_DSA_INDEX_SCORE_DTYPE=int8`) also as symmetric int8 rows with one float32 scale per token,
quantized once when written from the stored keys (what the `dsa` backend's int8 indexer reads;
the stored rows stay for the other readers: CP gathers, the reference indexer).

With `kv_dtype` FP8 (`--kv-cache-dtype fp8_*`) the latent rows are stored in 1 byte as
`fp8(row / k_scale)` of their layer (`kv_pool.quantize_kv`; the value is part of the same row, so
only the key scale applies), and the index keys as DeepSeek-V3.2's reference keeps them
(`index_k_fp8`): float8_e4m3fn with one float32 scale per block of INDEX_K_BLOCK (128) values,
scale = max(amax, 1e-4) / 448 (`quantize_index_k`). Like upstream SGLang's index-key buffer, the
codes and scales of a token share one uint8 row `[codes (padded to 4 bytes) ; scales]`, so every
copier of per-token buffers (PD transfer regions, HiCache pages) moves them together as stored;
readers take the views (`get_index_k_fp8`) or the widened rows (`index_k_rows`).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from sglang.srt.mem_cache.kv_pool import FP8_KV_DTYPES, KVPool, quantize_kv

INDEX_K_BLOCK = 128  # index-key values per FP8 scale (DeepSeek-V3.2: one per 128-dim key)
INDEX_K_FP8 = torch.float8_e4m3fn


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def index_k_fp8_layout(index_head_dim: int) -> tuple[int, int]:
    """(code bytes: the head dim padded to 4, scale count) of one FP8 index-key row; the row is
    code bytes + 4 x scale count bytes."""
    return -(-index_head_dim // 4) * 4, -(-index_head_dim // INDEX_K_BLOCK)


def quantize_index_k(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index keys [n, D] -> (float8_e4m3fn codes [n, D], float32 scales [n, ceil(D / 128)]): per
    block of 128 values scale = max(amax, 1e-4) / 448, code = fp8(x / scale) (DeepSeek-V3.2's
    act_quant of its indexer keys). A reader's value is code x scale (float32)."""
    n, dim = x.shape
    nb = -(-dim // INDEX_K_BLOCK)
    padded = torch.nn.functional.pad(x.float(), (0, nb * INDEX_K_BLOCK - dim)).view(n, nb, INDEX_K_BLOCK)
    scale = padded.abs().amax(dim=-1).clamp_(min=1e-4) / torch.finfo(INDEX_K_FP8).max
    codes = quantize_kv(padded / scale.unsqueeze(-1), INDEX_K_FP8)
    return codes.view(n, nb * INDEX_K_BLOCK)[:, :dim], scale


def widen_index_k(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 [n, D] of `quantize_index_k`'s output: each code (exact) times its block's scale."""
    per_value = scale.repeat_interleave(INDEX_K_BLOCK, dim=-1)[:, : codes.shape[-1]]
    return codes.float() * per_value


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
        """Rows [n, kv_cache_dim (+ more)] as a read of them after they are stored returns them
        (widened to `rows`' dtype): unchanged unless the pool stores FP8, which rounds the latent
        part (the columns past kv_cache_dim: the DSA pool's index keys, rounded there)."""
        if not self.is_fp8:
            return rows
        dim = self.kv_cache_dim
        scale = self.k_scale[self._local(layer_id)]
        out = quantize_kv(rows[:, :dim], self.dtype, scale).to(rows.dtype)
        out = out if scale == 1.0 else out * scale
        return out if rows.shape[1] == dim else torch.cat((out, rows[:, dim:]), dim=-1)

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
    """MLA pool plus index_k_buffer[i]: [size + page_size, index_head_dim] (Lightning Indexer keys,
    model dtype), or with `index_k_fp8` uint8 [size + page_size, code bytes + 4 x scales] (module
    doc); with `index_k_int8` also index_k_int8[i] (int8, [rows, index_head_dim]) and
    index_k_scale[i] [size + page_size] float32 (`sgl_kernel_npu.reference.quantize_int8` of each
    stored row). `index_k_fp8` None: FP8 exactly when the latent rows are (`--kv-cache-dtype fp8_*`
    gives a 1-byte cache, index keys included)."""

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
        index_k_fp8: Optional[bool] = None,
    ):
        super().__init__(
            size, page_size, dtype, kv_lora_rank, qk_rope_head_dim, layer_num, device, start_layer, kv_dtype
        )
        self.index_head_dim = index_head_dim
        self.index_k_fp8 = self.is_fp8 if index_k_fp8 is None else index_k_fp8
        rows = size + page_size
        code_bytes, nb = index_k_fp8_layout(index_head_dim)
        if self.index_k_fp8:
            width, idx_dtype = code_bytes + 4 * nb, torch.uint8
        else:
            width, idx_dtype = index_head_dim, dtype
        self.index_k_buffer = [self._zeros(rows, width, dtype=idx_dtype) for _ in range(layer_num)]
        self._index_fp8_views = [
            (b[:, :index_head_dim].view(INDEX_K_FP8), b[:, code_bytes:].view(torch.float32))
            for b in (self.index_k_buffer if self.index_k_fp8 else [])
        ]
        n8 = layer_num if index_k_int8 else 0
        self.index_k_int8 = [self._zeros(rows, index_head_dim, dtype=torch.int8) for _ in range(n8)]
        self.index_k_scale = [self._zeros(rows, dtype=torch.float32) for _ in range(n8)]

    def get_index_k_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's index keys as stored (FP8: the uint8 rows of codes and scales)."""
        return self.index_k_buffer[self._local(layer_id)]

    def get_index_k_fp8(self, layer_id: int) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """(float8_e4m3fn codes [rows, index_head_dim], float32 scales [rows, blocks]): views of
        the FP8 index keys (strided rows), or None when they are stored in the model dtype."""
        return self._index_fp8_views[self._local(layer_id)] if self.index_k_fp8 else None

    def index_k_rows(self, layer_id: int, slots: torch.Tensor) -> torch.Tensor:
        """The index keys at `slots` [n, index_head_dim] in the model dtype (FP8: widened, code x
        scale in float32, then cast), as CP exchanges and the torch indexer read them."""
        slots = slots.to(device=self.device, dtype=torch.int64)
        fp8 = self.get_index_k_fp8(layer_id)
        if fp8 is None:
            return self.get_index_k_buffer(layer_id).index_select(0, slots)
        wide = widen_index_k(fp8[0].index_select(0, slots), fp8[1].index_select(0, slots))
        return wide.to(self.compute_dtype)

    def get_index_k_int8(self, layer_id: int) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """(int8 rows [rows, index_head_dim], scales [rows]) of the int8 copy, or None without one."""
        if not self.index_k_int8:
            return None
        i = self._local(layer_id)
        return self.index_k_int8[i], self.index_k_scale[i]

    def set_index_k_buffer(self, layer_id: int, loc: torch.Tensor, index_k: torch.Tensor) -> None:
        """Write the indexer keys [n, index_head_dim] of new tokens (and their int8 copy)."""
        i, loc = self._local(layer_id), loc.to(device=self.device, dtype=torch.int64)
        if self.index_k_fp8:
            codes, scale = quantize_index_k(index_k.reshape(-1, self.index_head_dim))
            code_bytes = index_k_fp8_layout(self.index_head_dim)[0]
            row = self.index_k_buffer[i].new_zeros((codes.shape[0], self.index_k_buffer[i].shape[1]))
            row[:, : self.index_head_dim] = codes.view(torch.uint8)
            row[:, code_bytes:] = scale.view(torch.uint8).view(codes.shape[0], -1)
            self.index_k_buffer[i][loc] = row
            stored = widen_index_k(codes, scale)
        else:
            self.index_k_buffer[i][loc] = index_k.to(self.compute_dtype)
            stored = self.index_k_buffer[i][loc]
        if self.index_k_int8:
            from sgl_kernel_npu.reference import quantize_int8

            # from the stored rows: what an indexer reading the stored cache would quantize
            k8, scale8 = quantize_int8(stored)
            self.index_k_int8[i][loc] = k8
            self.index_k_scale[i][loc] = scale8

    def round_as_stored(self, layer_id: int, rows: torch.Tensor) -> torch.Tensor:
        """The MLA pool's rounding of the latent part, and with FP8 index keys the columns past
        kv_cache_dim (the index keys) as a read of them returns them (`index_k_rows`)."""
        out = super().round_as_stored(layer_id, rows)
        dim = self.kv_cache_dim
        if not self.index_k_fp8 or rows.shape[1] == dim:
            return out
        keys = widen_index_k(*quantize_index_k(rows[:, dim:])).to(self.compute_dtype).to(rows.dtype)
        return torch.cat((out[:, :dim], keys), dim=-1)

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
        index_k_fp8: Optional[bool] = None,
    ) -> int:
        """Bytes per token: latent rows in `kv_dtype` (default `dtype`), indexer keys in `dtype`, or
        in FP8 with their scales (`index_k_fp8`; None: when `kv_dtype` is FP8)."""
        fp8 = (kv_dtype in FP8_KV_DTYPES) if index_k_fp8 is None else index_k_fp8
        int8_copy = (index_head_dim + 4) * layer_num if index_k_int8 and index_head_dim else 0
        latent = (kv_lora_rank + qk_rope_head_dim) * layer_num * _itemsize(kv_dtype or dtype)
        if fp8 and index_head_dim:
            code_bytes, nb = index_k_fp8_layout(index_head_dim)
            index = (code_bytes + 4 * nb) * layer_num
        else:
            index = index_head_dim * layer_num * _itemsize(dtype)
        return latent + index + int8_copy
