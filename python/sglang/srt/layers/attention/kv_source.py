"""Where a backend reads a request's cached K/V from, planned once per forward (imports only torch).

A request's KV slots (`req_to_token[row, :seq_len]`) are often one contiguous run of pool rows
(the allocator hands out consecutive pages): then every layer can attend over a zero-copy view of
the pool (`KVRun`). Otherwise the slots are gathered (`KVGather`) with one `index_select` per
layer, optionally into a scratch buffer that the forward allocates once and every layer reuses
(`KVWorkspace`: a fresh multi-MB tensor per layer can cost page faults).

Buffers are addressed head-major, [H, rows, D]: `MHATokenToKVPool` stores them that way, so a
view or a gather hands SDPA one contiguous [L, D] block per head (its fastest CPU input).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch


@dataclass(frozen=True)
class KVRun:
    """The sequence's keys are pool rows start .. start + length - 1, in order."""

    start: int
    length: int


@dataclass(frozen=True)
class KVGather:
    """The sequence's keys are the pool rows `indices` ([n] int64, any order of runs)."""

    indices: torch.Tensor
    # (H, rows) -> [H * n] row indices into the buffer flattened to [H * rows, D]; built once
    _flat: dict = field(default_factory=dict, compare=False, repr=False)

    def head_flat_indices(self, heads: int, rows: int) -> torch.Tensor:
        """Indices that gather all heads of `indices` from a [H, rows, D] buffer seen as
        [H * rows, D] in ONE dim-0 `index_select` (which torch parallelises over rows; a dim-1
        select over H = 2-8 heads runs on one thread)."""
        key = (heads, rows)
        idx = self._flat.get(key)
        if idx is None:
            offsets = torch.arange(heads, dtype=self.indices.dtype, device=self.indices.device) * rows
            idx = (offsets.unsqueeze(1) + self.indices.unsqueeze(0)).reshape(-1)
            self._flat[key] = idx
        return idx


KVSource = Union[KVRun, KVGather]


def contiguous_run(slots: torch.Tensor) -> Optional[KVRun]:
    """slots [L] int64 -> KVRun if slots == slots[0] + arange(L), else None (L >= 1)."""
    n = int(slots.numel())
    if n == 0:
        return None
    first = int(slots[0])
    if n == 1:
        return KVRun(first, 1)
    if int(slots[-1]) - first != n - 1:
        return None
    if not bool((slots[1:] - slots[:-1] == 1).all()):
        return None
    return KVRun(first, n)


def plan_source(slots: torch.Tensor) -> KVSource:
    """One request's slots [L] -> a view when they are one run, else a gather."""
    run = contiguous_run(slots)
    return run if run is not None else KVGather(slots)


def head_major_kv(pool: Any, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, V) of a layer as [H, rows, D] tensors (views; no copy) for any MHA-style pool."""
    get = getattr(pool, "get_kv_buffer_head_major", None)
    if get is not None:
        return get(layer_id)
    k, v = pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id)
    return k.transpose(0, 1), v.transpose(0, 1)


class KVWorkspace:
    """Per-forward scratch for gathered K/V, grown on demand and shared by every layer.

    A tensor taken from it is valid until the next `take` under the same name: callers finish
    attending over one gather before starting the next.
    """

    def __init__(self) -> None:
        self._flat: dict[str, torch.Tensor] = {}

    def take(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A contiguous tensor of `shape` backed by the buffer `name` (contents undefined)."""
        numel = 1
        for s in shape:
            numel *= s
        buf = self._flat.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._flat[name] = buf
        return buf[:numel].view(shape)


def fetch(buf: torch.Tensor, src: KVSource, ws: Optional[KVWorkspace], name: str) -> torch.Tensor:
    """Rows of a head-major buffer [H, rows, D] -> [H, L, D] (a view for a run, else gathered)."""
    if isinstance(src, KVRun):
        return buf.narrow(1, src.start, src.length)
    heads, rows, dim = buf.shape
    n = int(src.indices.numel())
    if not buf.is_contiguous():
        return buf.index_select(1, src.indices)
    flat_idx = src.head_flat_indices(heads, rows)
    if ws is None:
        return buf.view(heads * rows, dim).index_select(0, flat_idx).view(heads, n, dim)
    out = ws.take(name, (heads * n, dim), buf.dtype, buf.device)
    return torch.index_select(buf.view(heads * rows, dim), 0, flat_idx, out=out).view(heads, n, dim)


# FP8 -> bfloat16 by moving bits: sign-extend the byte to 16 bits, shift the exponent and mantissa
# under bf16's, clear the sign copies between them; the result is the value times 2^-(127 - bias),
# which one multiply (with the layer's scale folded in) undoes, exactly for every finite code
# (subnormals included: bf16's subnormal range starts where the shifted codes land). 3-10x faster
# than torch's element-wise FP8 casts on CPU. The pools never store FP8 NaN / inf (writes saturate).
_FP8_WIDEN = {  # dtype: (shift, mask as int16, 2 ** (127 - exponent bias))
    torch.float8_e4m3fn: (4, -30736, 2.0**120),  # mask 0x87F0
    torch.float8_e5m2: (5, -28704, 2.0**112),  # mask 0x8FE0
}


def widen_kv(rows: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Cached rows read from the pool -> `dtype` (the compute dtype), times the layer's scale
    (`--kv-cache-dtype fp8_*` stores `x / scale` in 1 byte; the scale is 1.0 otherwise)."""
    bits = _FP8_WIDEN.get(rows.dtype)
    if bits is not None and dtype in (torch.bfloat16, torch.float32):
        shift, mask, unbias = bits
        t = rows.view(torch.int8).to(torch.int16)  # same item size: a view of any layout
        t.bitwise_left_shift_(shift).bitwise_and_(mask)
        wide = t.view(torch.bfloat16)
        return wide * (unbias * scale) if dtype == torch.bfloat16 else wide.float().mul_(unbias * scale)
    rows = rows.to(dtype)
    return rows if scale == 1.0 else rows * scale


def kv_scales(pool: Any, layer_id: int) -> tuple[float, float]:
    """(key scale, value scale) a reader multiplies the layer's widened rows by (1.0 unless the
    pool stores FP8 with the checkpoint's scales)."""
    get = getattr(pool, "kv_scales", None)
    return get(layer_id) if get is not None else (1.0, 1.0)
