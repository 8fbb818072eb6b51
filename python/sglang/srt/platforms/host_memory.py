"""Zero-filled host buffers for long-lived pools, from anonymous memory maps.

`torch.zeros` writes every byte of a buffer when it is made: a SmolLM2 float32 KV pool (1.44 GB)
took 0.83 s of one core at every server start and its whole size in RAM at once. An anonymous map
is made of the kernel's shared zero page until a page is first written, so the pool costs nothing
at start and RAM only as it fills (`CpuPlatform.zeros`). Buffers are page-aligned (4096 bytes).
"""

from __future__ import annotations

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
