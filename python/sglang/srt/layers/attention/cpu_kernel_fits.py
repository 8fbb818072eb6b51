"""Which tensors the fused CPU prefill kernels take (kernels/cpu): the layout and dtype checks the
`cpu` backend and its CP prefill path (`cpu_cp_fresh.py`) make before calling one."""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from sglang.srt.mem_cache.kv_pool import FP8_KV_DTYPES


def amx_prefill_fits(*tensors: torch.Tensor) -> bool:
    """Whether the fused `prefill_attention` covers these tensors: bf16 with head dim 64, the
    64 values of a head contiguous ([n, heads, 64] views of q / k / v, or the rows of the
    head-major pool buffers [heads, rows, 64])."""
    return all(
        t.dtype == torch.bfloat16 and t.shape[-1] == 64 and t.stride(-1) == 1 and t.stride(-2) == 64
        for t in tensors
    )


def vec_prefill_fits(*tensors: torch.Tensor) -> bool:
    """Whether the fused float32 `prefill_attention_vec` covers these tensors: one dtype (float32
    or bf16), head dim 64 or 128, the values of a head contiguous (as `amx_prefill_fits`). The pool
    buffers of a cached prefix (after q / k / v) may instead both be FP8 of q's head dim: the
    kernel widens their rows (times the layer's scales) as it copies them."""
    pools = tensors[3:]
    if pools and all(t.dtype in FP8_KV_DTYPES for t in pools):
        d = tensors[0].shape[-1]
        return vec_prefill_fits(*tensors[:3]) and all(
            t.shape[-1] == d and t.stride(-1) == 1 and t.stride(-2) == d for t in pools
        )
    dtype = tensors[0].dtype
    return dtype in (torch.float32, torch.bfloat16) and all(
        t.dtype == dtype and t.shape[-1] in (64, 128) and t.stride(-1) == 1 and t.stride(-2) == t.shape[-1]
        for t in tensors
    )


def vec_prefill_kernel(vec: Any, compute_dtype: torch.dtype, *tensors: torch.Tensor) -> Optional[Any]:
    """`vec` (`prefill_attention_vec`, where the build has it) as it takes these tensors at this
    compute dtype: float32 compute (bf16 or float32 tensors, widened in the kernel), or bf16 compute
    over bf16 q / k / v and a bf16 or FP8 prefix pool (its `bf16_dot` path: q.k and p.v by bf16 dot
    products in the avx512bf16 build, FP8 rows widened to bf16 times their scales; float32
    elsewhere); None where it does not fit."""
    if not vec_prefill_fits(*tensors):
        return None
    if compute_dtype == torch.float32:
        return vec
    fresh, pools = tensors[:3], tensors[3:]
    if (
        compute_dtype == torch.bfloat16
        and all(t.dtype == torch.bfloat16 for t in fresh)
        and all(t.dtype in (torch.bfloat16, *FP8_KV_DTYPES) for t in pools)
    ):
        return functools.partial(vec, bf16_dot=True)
    return None
