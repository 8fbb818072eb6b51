"""Zero-filled host buffers for long-lived pools, from anonymous memory maps.

`torch.zeros` writes every byte of a buffer when it is made: a SmolLM2 float32 KV pool (1.44 GB)
took 0.83 s of one core at every server start and its whole size in RAM at once. An anonymous map
is made of the kernel's shared zero page until a page is first written, so the pool costs nothing
at start and RAM only as it fills (`CpuPlatform.zeros`). Buffers are page-aligned (4096 bytes).

A first write then costs a page fault (~1-2 us a page here: a 2048-token prefill of SmolLM2 spent
24 ms of its 477 in them), so the model runner warms the slots the allocator hands out first in
the background after start-up (`PagePopulator`, `KVPool.warm_ranges`, SGLANG_CPU_KV_PREFAULT_GB).
"""

from __future__ import annotations

import ctypes
import math
import mmap
from typing import Sequence

import torch

# below this a map is not worth its page rounding and its own mapping
LAZY_ZERO_MIN_BYTES = 1 << 20


def lazy_zeros(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A zero CPU tensor of `shape` / `dtype` whose pages are committed on first write. The tensor
    keeps its map alive; the map is unmapped when the last view of it is freed."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes < LAZY_ZERO_MIN_BYTES:
        return torch.zeros(tuple(shape), dtype=dtype)
    raw = torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8)
    return raw.view(dtype).view(tuple(shape))


MADV_POPULATE_WRITE = 23  # <linux/mman.h>, Linux 5.14+ (Python 3.11's mmap module lacks the name)
PAGE = mmap.PAGESIZE


class PagePopulator:
    """Commits a tensor's pages ahead of their first write (`madvise(MADV_POPULATE_WRITE)`: the
    kernel faults them in as if written, their contents unchanged, so it may run beside writers),
    through ctypes so that the call releases the GIL. `populate` answers False where the kernel or
    libc lacks it (nothing is touched then)."""

    def __init__(self) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self._madvise = libc.madvise
            self._madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            self._madvise.restype = ctypes.c_int
        except (OSError, AttributeError):
            self._madvise = None

    def populate(self, tensor: torch.Tensor, start: int, nbytes: int) -> bool:
        """Bytes [start, start + nbytes) of `tensor`'s storage (widened to whole pages)."""
        if self._madvise is None or nbytes <= 0:
            return self._madvise is not None
        base = tensor.untyped_storage().data_ptr()
        lo = (base + start) // PAGE * PAGE
        hi = -(-(base + start + nbytes) // PAGE) * PAGE
        return self._madvise(lo, hi - lo, MADV_POPULATE_WRITE) == 0
