"""KV cache storage: per-layer key/value buffers indexed by KV slot.

`dtype` is the model (compute) dtype; `kv_dtype` (default: `dtype`) the dtype K/V are stored in,
`--kv-cache-dtype`. With a 1-byte FP8 `kv_dtype` every layer has a key and a value scale (1.0
unless the checkpoint gives `k_scale` / `v_scale`, `kv_scales.py`): rows are stored as
`fp8(x / scale)` (saturated to the format's range) and readers widen them back with `widen_kv`
(`fp8 -> compute dtype, * scale`). `pool.dtype` is the stored dtype (upstream's meaning).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Optional, Protocol, Union

import torch

FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


class LayerGate(Protocol):
    """Rows of a layer still being written by someone else (HiCache's `LayerLoader`)."""

    def wait(self, layer: int) -> None:
        """Return once the pending writes of local layer `layer` are done."""


def quantize_kv(x: torch.Tensor, kv_dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """`x` in the stored dtype: a plain cast, or for FP8 `x / scale` saturated to its range."""
    if kv_dtype not in FP8_KV_DTYPES:
        return x.to(kv_dtype)
    if scale != 1.0:
        x = x / scale
    limit = torch.finfo(kv_dtype).max
    return x.clamp(-limit, limit).to(kv_dtype)


class KVPool(ABC):
    """Storage of the KV cache for layers [start_layer, start_layer + layer_num).

    Row 0 (page 0) is the padding slot; buffers hold `size + page_size` rows so that every slot
    the allocator can hand out (1..size) is valid. `layer_id` arguments are global layer indices.
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        layer_num: int,
        device: Union[str, torch.device] = "cpu",
        start_layer: int = 0,
        kv_dtype: Optional[torch.dtype] = None,
    ):
        self.size = size
        self.page_size = page_size
        self.compute_dtype = dtype
        self.dtype = dtype if kv_dtype is None else kv_dtype  # as stored
        self.layer_num = layer_num
        self.device = torch.device(device)
        self.start_layer = start_layer
        self.end_layer = start_layer + layer_num
        self.k_scale = [1.0] * layer_num  # per local layer; FP8 stores x / scale
        self.v_scale = [1.0] * layer_num
        # scattered writes go through a byte view for FP8 (upstream stores uint8: accelerators'
        # index_put has no float8 kernels); a plain view of the same bytes elsewhere
        self._store_view = torch.uint8 if self.dtype in FP8_KV_DTYPES else self.dtype
        self._buffers: list[tuple[torch.Tensor, int]] = []  # every buffer and its slot (row) dim
        self.layer_gate: Optional[LayerGate] = None  # HiCache: rows still being loaded, per layer

    def _zeros(self, *shape: int, dtype: Optional[torch.dtype] = None, rows_dim: int = 0) -> torch.Tensor:
        """One zero buffer of the pool, as the device's platform makes pools (CPU: pages
        committed on first write, platforms/host_memory.py); `rows_dim`: its slot dim (0 or 1)."""
        from sglang.srt.platforms import get_platform

        buf = get_platform(self.device.type).zeros(shape, self.dtype if dtype is None else dtype, self.device)
        self._buffers.append((buf, rows_dim))
        return buf

    def slot_bytes(self) -> int:
        """Bytes one slot takes over every buffer of the pool."""
        return sum(b.stride(d) * b.element_size() * (b.shape[0] if d == 1 else 1) for b, d in self._buffers)

    def warm_ranges(self, lo: int, hi: int) -> list[tuple[torch.Tensor, int, int]]:
        """(buffer, first byte, bytes) of every buffer's storage holding slots [lo, hi): one range
        per buffer, or per head of a head-major one (mem_cache/kv_warm.py commits them)."""
        out = []
        for buf, dim in self._buffers:
            a, b = min(lo, buf.shape[dim]), min(hi, buf.shape[dim])
            if a >= b:
                continue
            size = buf.element_size()
            row, base = buf.stride(dim) * size, buf.storage_offset() * size
            heads = buf.shape[0] if dim == 1 else 1
            out += [(buf, base + h * buf.stride(0) * size + a * row, (b - a) * row) for h in range(heads)]
        return out

    @property
    def is_fp8(self) -> bool:
        return self.dtype in FP8_KV_DTYPES

    def kv_scales(self, layer_id: int) -> tuple[float, float]:
        """(key scale, value scale) of a layer: what a reader multiplies the widened rows by."""
        i = self._local(layer_id)
        return self.k_scale[i], self.v_scale[i]

    def set_kv_scales(self, layer_id: int, k_scale: float, v_scale: float) -> None:
        """The checkpoint's scales of a layer (before any KV is written); FP8 pools only (other
        dtypes store values unscaled, and the attention kernels read them so)."""
        if not self.is_fp8:
            raise ValueError(f"KV scales are for FP8 pools; this pool stores {self.dtype}")
        i = self._local(layer_id)
        self.k_scale[i], self.v_scale[i] = float(k_scale), float(v_scale)

    def attach_layer_gate(self, gate: LayerGate) -> None:
        """Every per-layer access waits for `gate.wait(local layer)` first (HiCache's layer-by-layer
        loads, hicache/layer_load.py)."""
        self.layer_gate = gate

    def _local(self, layer_id: int) -> int:
        """The local index of a global layer id; the layer's pending loads are waited for."""
        if not self.start_layer <= layer_id < self.end_layer:
            raise IndexError(f"layer {layer_id} not held by this pool [{self.start_layer}, {self.end_layer})")
        local = layer_id - self.start_layer
        if self.layer_gate is not None:
            self.layer_gate.wait(local)
        return local

    @abstractmethod
    def get_key_buffer(self, layer_id: int) -> torch.Tensor: ...

    @abstractmethod
    def get_value_buffer(self, layer_id: int) -> torch.Tensor: ...

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    @abstractmethod
    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None: ...

    @abstractmethod
    def mem_bytes(self) -> int: ...


class MHATokenToKVPool(KVPool):
    """Multi-head KV cache: k_buffer[i], v_buffer[i] of shape [size + page_size, head_num, head_dim].

    Storage is head-major: each layer's keys live in one contiguous [head_num, rows, head_dim]
    tensor (`get_kv_buffer_head_major`), and `k_buffer[i]` / `get_key_buffer` are [rows, H, D]
    views of it (index and assign them as before; they are not contiguous, so use `reshape`, not
    `view`, to flatten them). Head-major lets attention read a contiguous run of a request's slots
    as one contiguous [L, D] block per head, with no gather.

    `v_head_dim` defaults to `head_dim` (set it for models whose value dim differs).
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: Union[str, torch.device] = "cpu",
        start_layer: int = 0,
        v_head_dim: Optional[int] = None,
        kv_dtype: Optional[torch.dtype] = None,
        store_rows: Optional[Callable[..., None]] = None,
    ):
        super().__init__(size, page_size, dtype, layer_num, device, start_layer, kv_dtype)
        # (k_buf, v_buf, loc, k, v): a fused writer of scattered rows (kernel_dispatch.kv_store_op)
        self._store_rows = store_rows
        self.head_num = head_num
        self.head_dim = head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        rows = size + page_size
        self.k_head_major = [self._zeros(head_num, rows, head_dim, rows_dim=1) for _ in range(layer_num)]
        self.v_head_major = [
            self._zeros(head_num, rows, self.v_head_dim, rows_dim=1) for _ in range(layer_num)
        ]
        self.k_buffer = [b.transpose(0, 1) for b in self.k_head_major]
        self.v_buffer = [b.transpose(0, 1) for b in self.v_head_major]
        self._run_cache: Optional[tuple[torch.Tensor, Optional[int]]] = None

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[self._local(layer_id)]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[self._local(layer_id)]

    def get_kv_buffer_head_major(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K [head_num, rows, head_dim], V [head_num, rows, v_head_dim]), contiguous storage."""
        i = self._local(layer_id)
        return self.k_head_major[i], self.v_head_major[i]

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        """Write K/V of tokens to slots `loc`; inputs may be [n, H, D] or [n, H*D], any float dtype
        (quantized to the stored dtype with the layer's scales)."""
        i = self._local(layer_id)
        if self._fused_store_fits(loc, cache_k, cache_v) and self._slot_run_start(loc) is None:
            # scattered rows of the stored dtype (decode, prefix hits): one fused call
            self._store_rows(self.k_head_major[i], self.v_head_major[i], loc, cache_k, cache_v)
            return
        n = cache_k.shape[0]
        k = quantize_kv(cache_k.reshape(n, self.head_num, self.head_dim), self.dtype, self.k_scale[i])
        v = quantize_kv(cache_v.reshape(n, self.head_num, self.v_head_dim), self.dtype, self.v_scale[i])
        loc = loc.to(device=self.device, dtype=torch.int64)
        start = self._slot_run_start(loc)
        if start is not None:  # one run of consecutive slots (a fresh prefill): two slice copies
            self.k_head_major[i][:, start : start + n].copy_(k.transpose(0, 1))
            self.v_head_major[i][:, start : start + n].copy_(v.transpose(0, 1))
            return
        # index_copy_ along the rows of the contiguous head-major storage: an index assignment into
        # the transposed [rows, H, D] view went through the whole layer buffer (6 ms a call for a
        # 77 MB layer, 1000x the index_copy_; it grew with the pool, not the batch)
        sv = self._store_view
        self.k_head_major[i].view(sv).index_copy_(1, loc, k.view(sv).transpose(0, 1))
        self.v_head_major[i].view(sv).index_copy_(1, loc, v.view(sv).transpose(0, 1))

    def _fused_store_fits(self, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
        """Whether `store_rows` takes these: int64 slots in one contiguous run of memory, K / V of
        the stored dtype with each token's values contiguous (what the kernel checks)."""
        if self._store_rows is None or loc.dtype != torch.int64 or loc.dim() != 1 or not loc.is_contiguous():
            return False
        return all(
            x.dtype == self.dtype
            and x.stride(-1) == 1
            and (x.dim() == 2 or (x.dim() == 3 and x.stride(1) == x.shape[2]))
            for x in (k, v)
        )

    # below this many slots the scattered write is as fast as finding out whether they are a run
    _RUN_MIN_SLOTS = 64

    def _slot_run_start(self, loc: torch.Tensor) -> Optional[int]:
        """First slot when `loc` is start, start + 1, ... (else None). Every layer of a forward
        writes the same `loc` tensor, so the answer is kept for that tensor object (a slice copy
        is much cheaper than the scattered index_put for a long prefill)."""
        cached = self._run_cache
        if cached is not None and cached[0] is loc:
            return cached[1]
        start = None
        n = loc.shape[0]
        if loc.dim() == 1 and n >= self._RUN_MIN_SLOTS:
            first = int(loc[0])
            if int(loc[-1]) - first == n - 1 and bool((loc[1:] - loc[:-1] == 1).all()):
                start = first
        self._run_cache = (loc, start)
        return start

    def mem_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in (*self.k_head_major, *self.v_head_major))

    @staticmethod
    def cell_size_bytes(
        head_num: int, head_dim: int, layer_num: int, dtype: torch.dtype, v_head_dim: Optional[int] = None
    ) -> int:
        """Bytes of K + V per token across `layer_num` layers (for sizing the pool)."""
        v_dim = head_dim if v_head_dim is None else v_head_dim
        itemsize = torch.empty((), dtype=dtype).element_size()
        return head_num * (head_dim + v_dim) * layer_num * itemsize
