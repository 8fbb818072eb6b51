"""Where a KV pool's bytes are, for moving KV between servers (PD disaggregation).

`kv_regions(pool)` describes every buffer of a pool as `KVRegion`s (one per layer and kind: keys,
values, MLA latent rows, DSA index keys) with the raw address, the bytes of one slot of one head,
and, for head-major MHA buffers, where each head's slab starts. A transfer engine registers the
regions once (`registration_ranges`) and then moves runs of slots:

* `slot_runs(src_slots, dst_slots)` merges the slot pairs of consecutive token positions into runs
  that are consecutive on both sides (a page run, or longer when pages happen to be adjacent);
* `copy_plan(src, dst, runs)` turns runs into (source address, destination address, bytes)
  triples for every layer and head both sides hold: heads are matched by their global index, so a
  sender holding heads 0..3 serves a receiver holding heads 2..3 (different tensor parallelism),
  and layers by their global id (a pipeline stage sends its own layers only).

Pure address arithmetic over torch / numpy; nothing here knows requests or models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from sglang.srt.mem_cache.kv_pool import KVPool, MHATokenToKVPool
from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool, MLATokenToKVPool


@dataclass(frozen=True)
class KVRegion:
    """One KV buffer of one layer. Slot s of head h (global head index) starts at
    `ptr + (h - head_offset) * head_stride + s * slot_bytes`."""

    kind: str  # "k" | "v" (MHA, head-major) | "latent" (MLA row) | "index_k" (+ "index_k_int8", "index_k_scale")
    layer_id: int  # global layer index
    ptr: int
    nbytes: int
    head_offset: int  # first global head held (0 for per-token rows)
    num_heads: int  # head slabs in the buffer (1 for per-token rows)
    head_stride: int  # bytes between the slabs of two heads
    slot_bytes: int  # bytes of one slot of one head
    dtype: str

    @property
    def key(self) -> tuple[str, int]:
        return (self.kind, self.layer_id)


def _region(kind: str, layer_id: int, t: torch.Tensor, head_offset: int, head_major: bool) -> KVRegion:
    if not t.is_contiguous():
        raise ValueError(f"KV buffer {kind} of layer {layer_id} is not contiguous")
    item = t.element_size()
    if head_major:  # [H, rows, D]
        heads, slot_bytes, head_stride = t.shape[0], t.shape[2] * item, t.stride(0) * item
    else:  # [rows, ...]: one row per slot
        heads, slot_bytes, head_stride = 1, t.stride(0) * item, 0
    return KVRegion(
        kind,
        layer_id,
        t.data_ptr(),
        t.numel() * item,
        head_offset if head_major else 0,
        heads,
        head_stride,
        slot_bytes,
        str(t.dtype).replace("torch.", ""),
    )


def kv_regions(pool: KVPool, head_offset: int = 0) -> list[KVRegion]:
    """Every buffer of `pool`. `head_offset`: the global index of the pool's first KV head (its
    tensor-parallel rank's share); ignored for MLA / DSA rows, which every rank holds whole."""
    out: list[KVRegion] = []
    for i in range(pool.layer_num):
        layer = pool.start_layer + i
        if isinstance(pool, MHATokenToKVPool):
            out.append(_region("k", layer, pool.k_head_major[i], head_offset, True))
            out.append(_region("v", layer, pool.v_head_major[i], head_offset, True))
        elif isinstance(pool, MLATokenToKVPool):
            out.append(_region("latent", layer, pool.kv_buffer[i], 0, False))
            if isinstance(pool, DSATokenToKVPool):
                out.append(_region("index_k", layer, pool.index_k_buffer[i], 0, False))
                if pool.index_k_int8:  # the int8 copy (int8 index scoring) and its per-token scales
                    out.append(_region("index_k_int8", layer, pool.index_k_int8[i], 0, False))
                    out.append(_region("index_k_scale", layer, pool.index_k_scale[i], 0, False))
        else:
            raise TypeError(f"no transfer layout for {type(pool).__name__}")
    return out


def registration_ranges(regions: Sequence[KVRegion]) -> list[tuple[int, int]]:
    """(address, bytes) of every distinct buffer, for registering the pool's memory once."""
    return sorted({(r.ptr, r.nbytes) for r in regions})


def slot_runs(src_slots: Sequence[int], dst_slots: Sequence[int]) -> np.ndarray:
    """[n, 3] int64 rows (src_start, dst_start, length): maximal runs of positions whose source and
    destination slots both advance by one."""
    src = np.asarray(src_slots, dtype=np.int64).reshape(-1)
    dst = np.asarray(dst_slots, dtype=np.int64).reshape(-1)
    if src.shape != dst.shape:
        raise ValueError(f"{src.size} source slots but {dst.size} destination slots")
    if src.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    breaks = np.nonzero((np.diff(src) != 1) | (np.diff(dst) != 1))[0] + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [src.size]))
    return np.stack((src[starts], dst[starts], ends - starts), axis=1)


def copy_plan(
    src: Sequence[KVRegion], dst: Sequence[KVRegion], runs: np.ndarray
) -> tuple[list[int], list[int], list[int]]:
    """(source addresses, destination addresses, byte counts) that copy `runs` of every layer and
    head held on both sides. Raises ValueError when a shared buffer's slot size or dtype differs
    (the two servers must cache the same model in the same KV dtype), or when only the receiver
    keeps int8 index keys."""
    by_key = {r.key: r for r in dst}
    src_keys = {r.key for r in src}
    for d in dst:  # the receiver would score int8 against index keys nobody wrote into its int8 copy
        if d.kind == "index_k_int8" and ("index_k", d.layer_id) in src_keys and d.key not in src_keys:
            raise ValueError(
                f"the receiver keeps int8 index keys (layer {d.layer_id}) and the sender does not: "
                "both servers need the same SGLANG_DSA_INDEX_SCORE_DTYPE"
            )
    s_all, d_all, n_all = [], [], []
    if len(runs) == 0:
        return [], [], []
    src_starts, dst_starts, lengths = runs[:, 0], runs[:, 1], runs[:, 2]
    for s in src:
        d = by_key.get(s.key)
        if d is None:
            continue
        if s.slot_bytes != d.slot_bytes or s.dtype != d.dtype:
            raise ValueError(
                f"KV layout mismatch in {s.kind} of layer {s.layer_id}: {s.slot_bytes} B/{s.dtype} per slot "
                f"here, {d.slot_bytes} B/{d.dtype} on the other side"
            )
        lo = max(s.head_offset, d.head_offset)
        hi = min(s.head_offset + s.num_heads, d.head_offset + d.num_heads)
        for h in range(lo, hi):
            s_base = s.ptr + (h - s.head_offset) * s.head_stride
            d_base = d.ptr + (h - d.head_offset) * d.head_stride
            s_all.append(s_base + src_starts * s.slot_bytes)
            d_all.append(d_base + dst_starts * d.slot_bytes)
            n_all.append(lengths * s.slot_bytes)
    if not s_all:
        return [], [], []
    return np.concatenate(s_all).tolist(), np.concatenate(d_all).tolist(), np.concatenate(n_all).tolist()
