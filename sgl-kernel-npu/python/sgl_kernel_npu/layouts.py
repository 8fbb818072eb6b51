"""Argument layouts of the DSA ops, turned into one canonical form that every implementation takes.

Upstream's Ascend ops (`lightning_indexer`, `sparse_flash_attention`) take queries in `TND` (tokens
of all requests back to back, `actual_seq_lengths_query` = CUMULATIVE end offsets, one per
request) or `BSND` ([batch, seq, heads, dim], `actual_seq_lengths_query` = per-request lengths,
default seq), and keys in `TND` (cumulative, like queries), `BSND` or `PA_BSND` (paged:
[num_blocks, block_size, 1, dim] with a `block_table` [batch, max_blocks] and per-request key
lengths `actual_seq_lengths_key`). `sparse_mode` 3 is the right-down causal mask: query i of a
request with q_len queries and kv_len keys sees keys j <= kv_len - q_len + i; mode 0 sees all
kv_len keys.

Canonical form (`Queries`, `PagedKeys`):
- queries flattened to [T, N, D]; `batch[t]` the request of token t, `kv_end[t]` how many of the
  request's keys (positions 0 .. kv_end-1) token t may see;
- keys as rows [R, D] (a 2-D view, rows may be strided), `block_table` [B, M] int32 and
  `block_size`: position j of request b lives in row block_table[b, j // bs] * bs + j % bs.
Outputs are produced flat ([T, ...]) and reshaped back to the query layout by `Queries.unflatten`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

QUERY_LAYOUTS = ("TND", "BSND")
# FP8 index keys: one float32 scale per block of this many elements of a row (DeepSeek-V3.2's
# indexer quantizes its keys to float8_e4m3fn per 128 values: one scale per key at head dim 128)
FP8_KEY_BLOCK = 128
FP8_KEY_DTYPE = torch.float8_e4m3fn
KEY_LAYOUTS = ("TND", "BSND", "PA_BSND")
SPARSE_MODES = (0, 3)


@dataclass
class Queries:
    q: torch.Tensor  # [T, N, D]
    batch: torch.Tensor  # [T] int32
    kv_end: torch.Tensor  # [T] int32: visible keys are positions [0, kv_end)
    lead_shape: tuple  # leading dims of the caller's layout ((T,) or (B, S))

    def unflatten(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(*self.lead_shape, *x.shape[1:])


@dataclass
class PagedKeys:
    rows: torch.Tensor  # [R, D]
    block_table: torch.Tensor  # [B, M] int32
    block_size: int
    kv_lens: torch.Tensor  # [B] int32
    # float32 scales: [R] of int8 rows (an int8 index-key cache), [R, ceil(D / FP8_KEY_BLOCK)] of
    # float8_e4m3fn rows (an FP8 index-key cache; columns contiguous, rows may be strided)
    scale: Optional[torch.Tensor] = None

    def slots(self, batch: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rows of `positions` (any shape, >= 0) of requests `batch` (broadcastable)."""
        bs = self.block_size
        blocks = self.block_table[batch.long(), (positions // bs).long()]
        return blocks.long() * bs + positions.long() % bs


def _as_int32(x, device) -> Optional[torch.Tensor]:
    if x is None:
        return None
    return torch.as_tensor(x, dtype=torch.int32, device=device).reshape(-1)


def _check_layout(name: str, value: str, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def canonical_keys(
    key: torch.Tensor,
    layout_key: str,
    actual_seq_lengths_key=None,
    block_table: Optional[torch.Tensor] = None,
    batch_size: Optional[int] = None,
    key_scale: Optional[torch.Tensor] = None,
) -> PagedKeys:
    """Keys of any layout as rows + block table (one kv head: the N dim of key is 1). `key_scale`:
    with int8 keys, one float32 scale per key row (key's shape without D), kept as `scale` [R];
    with float8_e4m3fn keys, one per FP8_KEY_BLOCK values of a row (key's shape with D replaced by
    ceil(D / FP8_KEY_BLOCK)), kept as `scale` [R, blocks].
    (FP8 rows without key_scale: the latent rows of sparse attention, with one kv_scale.)"""
    keys = _canonical_keys(key, layout_key, actual_seq_lengths_key, block_table)
    if key_scale is not None and key.dtype not in (torch.int8, FP8_KEY_DTYPE):
        raise ValueError(f"key_scale comes with int8 or float8_e4m3fn keys only, got {key.dtype} keys")
    if key.dtype == torch.int8 and key_scale is None:
        raise ValueError("int8 keys come with key_scale (one scale per key row)")
    if key_scale is not None:
        rows, dim = keys.rows.shape
        blocks = 1 if key.dtype == torch.int8 else -(-dim // FP8_KEY_BLOCK)
        if key_scale.numel() != rows * blocks:
            raise ValueError(
                f"key_scale must hold {blocks} scale(s) per key row ({rows} rows), got {key_scale.numel()}"
            )
        keys.scale = key_scale.reshape(rows) if key.dtype == torch.int8 else key_scale.reshape(rows, blocks)
    return keys


def _canonical_keys(key, layout_key, actual_seq_lengths_key, block_table) -> PagedKeys:
    _check_layout("layout_key", layout_key, KEY_LAYOUTS)
    dev = key.device
    lens = _as_int32(actual_seq_lengths_key, dev)
    if layout_key == "PA_BSND":
        if key.dim() != 4 or key.shape[2] != 1:
            raise ValueError(f"PA_BSND key must be [num_blocks, block_size, 1, D], got {tuple(key.shape)}")
        if block_table is None or lens is None:
            raise ValueError("PA_BSND keys need block_table and actual_seq_lengths_key")
        nb, bs, _, d = key.shape
        return PagedKeys(key.reshape(nb * bs, d), block_table.to(torch.int32), bs, lens)
    if layout_key == "BSND":
        if key.dim() != 4 or key.shape[2] != 1:
            raise ValueError(f"BSND key must be [B, S, 1, D], got {tuple(key.shape)}")
        b, s, _, d = key.shape
        lens = lens if lens is not None else torch.full((b,), s, dtype=torch.int32, device=dev)
        table = torch.arange(b, dtype=torch.int32, device=dev).unsqueeze(1)
        return PagedKeys(key.reshape(b * s, d), table, max(1, s), lens)
    # TND: cumulative end offsets
    if key.dim() != 3 or key.shape[1] != 1:
        raise ValueError(f"TND key must be [T, 1, D], got {tuple(key.shape)}")
    t, _, d = key.shape
    ends = lens if lens is not None else torch.tensor([t], dtype=torch.int32, device=dev)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    per = ends - starts
    width = max(1, int(per.max()) if per.numel() else 1)
    table = (starts.unsqueeze(1) + torch.arange(width, dtype=torch.int32, device=dev)).clamp(
        max=max(0, t - 1)
    )
    return PagedKeys(key.reshape(t, d), table.to(torch.int32), 1, per.to(torch.int32))


def canonical_queries(
    query: torch.Tensor,
    layout_query: str,
    kv_lens: torch.Tensor,
    actual_seq_lengths_query=None,
    sparse_mode: int = 3,
) -> Queries:
    """Queries of any layout, flattened, with each token's request and visible key count."""
    _check_layout("layout_query", layout_query, QUERY_LAYOUTS)
    if sparse_mode not in SPARSE_MODES:
        raise ValueError(
            f"sparse_mode must be one of {SPARSE_MODES} (0: no mask, 3: right-down causal), got {sparse_mode}"
        )
    dev = query.device
    lens = _as_int32(actual_seq_lengths_query, dev)
    if layout_query == "BSND":
        if query.dim() != 4:
            raise ValueError(f"BSND query must be [B, S, N, D], got {tuple(query.shape)}")
        b, s, n, d = query.shape
        q_lens = lens if lens is not None else torch.full((b,), s, dtype=torch.int32, device=dev)
        batch = torch.arange(b, dtype=torch.int32, device=dev).repeat_interleave(s)
        index = torch.arange(s, dtype=torch.int32, device=dev).repeat(b)
        lead = (b, s)
        flat = query.reshape(b * s, n, d)
    else:
        if query.dim() != 3:
            raise ValueError(f"TND query must be [T, N, D], got {tuple(query.shape)}")
        t = query.shape[0]
        ends = lens if lens is not None else torch.tensor([t], dtype=torch.int32, device=dev)
        if int(ends[-1]) != t:
            raise ValueError(f"TND: the last cumulative query length ({int(ends[-1])}) must equal T ({t})")
        starts = torch.cat([ends.new_zeros(1), ends[:-1]])
        q_lens = ends - starts
        batch = torch.arange(ends.numel(), dtype=torch.int32, device=dev).repeat_interleave(q_lens.long())
        index = torch.arange(t, dtype=torch.int32, device=dev) - starts[batch.long()]
        lead = (t,)
        flat = query
    if q_lens.numel() != kv_lens.numel():
        raise ValueError(f"{q_lens.numel()} query lengths but {kv_lens.numel()} key lengths")
    kv = kv_lens[batch.long()]
    if sparse_mode == 3:
        kv_end = (kv - q_lens[batch.long()] + index + 1).clamp(min=0)
        kv_end = torch.minimum(kv_end, kv)
    else:
        kv_end = kv
    if layout_query == "BSND":  # padding queries past a request's length see nothing
        kv_end = kv_end.masked_fill(index >= q_lens[batch.long()], 0)
    return Queries(flat, batch.to(torch.int32), kv_end.to(torch.int32), lead)
