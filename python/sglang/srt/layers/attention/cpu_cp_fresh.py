"""The fused prefill kernels for the FRESH requests of a context-parallel batch (`cpu` backend).

Under CP a prompt's tokens are split over the ranks (zigzag: two contiguous runs per rank); after
the K/V all-gather, each of a rank's runs of queries at positions [a, b] attends causally to keys
[0, b]: the keys before the run are a prefix, the run's own keys a causal square. That is the form
of a prefill chunk over a cached prefix, which the fused kernels (`prefill_attention` on AMX for
bf16 head dim 64, `prefill_attention_vec` where attention computes in float32) run in one call per
run, reading the prefix from a head-major copy of the gathered keys. The reference path
(`ops.causal_attention_lse`) runs two SDPA calls per query block and merges them; on the AMX VM
cp 2 of a 16K prompt gained only 1.29x over cp 1, whose prefill used the fused kernel.
"""

from __future__ import annotations

import functools

from typing import Any, Callable, Optional

import torch

from sglang.srt.layers.attention.ops import contiguous_runs
from sglang.srt.layers.attention.cpu_kernel_fits import amx_prefill_fits, vec_prefill_kernel
from sglang.srt.platforms.kernel_dispatch import kernels_for_device, prefill_attention_dtype

# (q [n, H, D], q_pos [n] ascending, k [N, Hk, D], v [N, Hk, Dv], scale) -> out [n, H, Dv] or None
FreshAttention = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], Optional[torch.Tensor]
]


def _kernel_for(kernels: Any, q: torch.Tensor, *tensors: torch.Tensor) -> Optional[Any]:
    """The fused kernel these tensors fit on this device, or None (the reference path runs)."""
    amx = bool(kernels.prefill_attention_supported())
    if amx and amx_prefill_fits(q, *tensors):
        return kernels.prefill_attention
    compute = prefill_attention_dtype(q.device, q.dtype)
    if bool(kernels.prefill_attention_vec_supported()) and (compute == torch.float32 or not amx):
        return vec_prefill_kernel(kernels.prefill_attention_vec, compute, q, *tensors)  # (bf16 on AMX: SDPA)
    return None


def _same_kernel(a: Optional[Any], b: Any) -> bool:
    """Whether `a` is the kernel `b` (a `bf16_dot` partial is made anew at each lookup)."""
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return a.func is b.func and a.keywords == b.keywords
    return a is b


def fused_fresh_attention(
    q: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> Optional[torch.Tensor]:
    """Causal attention of a FRESH request's local queries over its gathered K/V with the fused
    kernels, one call per contiguous run of query positions; None where no kernel fits (the
    caller runs the reference)."""
    kernels = kernels_for_device(q.device)
    if kernels is None or q.shape[0] == 0:
        return None
    positions = q_pos.tolist()
    if positions != sorted(positions):
        return None
    kernel = _kernel_for(kernels, q, k, v)
    if kernel is None:
        return None
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[-1]))
    k_major = v_major = None
    for s, e in contiguous_runs(positions):
        a, b = positions[s], positions[e - 1] + 1
        if a == 0:
            kernel(q[s:e], k[:b], v[:b], scale, out=out[s:e])
            continue
        if k_major is None:  # the prefix rows read in place as from the pool: [Hk, N, D]
            k_major, v_major = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
            if not _same_kernel(_kernel_for(kernels, q, k, v, k_major, v_major), kernel):
                return None
        prefix = torch.arange(a, dtype=torch.int64)
        kernel(q[s:e], k[a:b], v[a:b], scale, k_major, v_major, prefix, out=out[s:e])
    return out
