"""float32 values of GGUF tensors: the block formats the common GGUF files use (Q8_0, Q4_0, Q4_1)
dequantized with torch over the whole tensor at once; any other type through `gguf.quants`.

`gguf.quants.dequantize` is numpy with a temporary per step: ~8 CPU-s for SmolLM2's 135M Q4_1/Q8_0
weights, paid by every rank at every start. The same arithmetic in torch (each block's scale `d`
and minimum `m` are fp16 widened to float32; values `d * q (+ m)` in float32, in that order) gives
bit-identical results (`test/unit/test_gguf_file.py` checks against gguf's) in a fraction of it.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

_Q = GGMLQuantizationType


def dequantize_gguf(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """float32 array of a tensor's raw data as `gguf_file` hands it out (bytes per row for block types)."""
    if qtype == _Q.F32:
        return np.array(data, dtype=np.float32, copy=True)
    fast = _TORCH_BLOCKS.get(qtype)
    if fast is None:
        return np.asarray(dequantize(data, qtype), dtype=np.float32)
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = torch.from_numpy(
        np.array(data, copy=True).reshape(-1, type_size)
    )  # a copy: the memmap is read-only
    values = fast(raw)
    row_bytes = data.shape[-1]
    return values.reshape(*data.shape[:-1], row_bytes // type_size * block).numpy()


def _scale(raw: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at bytes [start, start + 2) of each block, as float32 [n_blocks, 1]."""
    return raw[:, start : start + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n_blocks, 16] bytes -> [n_blocks, 32] values: the low nibbles first, then the high ones.
    (Contiguous first: torch's uint8 bit ops on a strided view are ~4x slower.)"""
    qs = qs.contiguous()
    return torch.cat((qs & 0x0F, qs >> 4), dim=1)


def _q8_0(raw: torch.Tensor) -> torch.Tensor:
    q = raw[:, 2:].contiguous().view(torch.int8).to(torch.float32)
    return q * _scale(raw, 0)


def _q4_0(raw: torch.Tensor) -> torch.Tensor:
    q = (_nibbles(raw[:, 2:]).to(torch.int8) - 8).to(torch.float32)
    return _scale(raw, 0) * q


def _q4_1(raw: torch.Tensor) -> torch.Tensor:
    q = _nibbles(raw[:, 4:]).to(torch.float32)
    return _scale(raw, 0) * q + _scale(raw, 2)


_TORCH_BLOCKS = {_Q.Q8_0: _q8_0, _Q.Q4_0: _q4_0, _Q.Q4_1: _q4_1}
