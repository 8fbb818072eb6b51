"""Kernel dispatch table: which kernels serve a tensor's device and dtype.

Besides our fused kernels (`fused_ops`), this is where device-specific choices among torch's own
kernels are made (`flash_lse_op`, `splits_attention`, `host_argmax`), so that layers hold no
device checks.

Layers ask `fused_ops(x)` and fall back to their torch code when it returns None, so every
platform without fused kernels (or a dtype they do not cover) keeps working unchanged. The answers
are the state of the device's platform object (`Platform.kernels`, kernel_table.py): the process's
platforms are created once, at start-up, so the kernel build is imported once per process. A test
that changes SGLANG_CPU_KERNELS / SGLANG_CPU_ISA / SGLANG_CPU_FLAGS_OVERRIDE runs under
`platforms.fresh_platforms()`: new platform objects, which look everything up again.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from sglang.srt.platforms import get_platform
from sglang.srt.platforms.kernel_table import KernelTable

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


def _table(device_type: str) -> Optional[KernelTable]:
    try:
        return get_platform(device_type).kernels
    except ValueError:  # a device type without a platform (meta, ...)
        return None


def kernels_for_device(device: torch.device) -> Optional[Any]:
    """The fused kernel module of the device's platform, or None."""
    table = _table(device.type)
    return None if table is None else table.fused()


def fused_ops(x: torch.Tensor) -> Optional[Any]:
    """The fused kernels for x (its device and dtype), or None."""
    if x.dtype not in SUPPORTED_DTYPES:
        return None
    return kernels_for_device(x.device)


_FLASH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def flash_lse_op(q: torch.Tensor) -> Optional[Callable[..., Any]]:
    """torch's CPU flash attention, which also returns the log-sum-exp, when it serves q (CPU,
    float32 / bfloat16); None elsewhere (callers use the exact-math fallback)."""
    if _FLASH_LSE is None or q.device.type != "cpu" or q.dtype not in SUPPORTED_DTYPES:
        return None
    return _FLASH_LSE


def prefill_attention_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype torch's prefill attention runs in for q / k / v of `dtype` on `device` (the
    platform's answer, kept by it: e.g. float32 for bf16 on CPUs without AMX)."""
    table = _table(device.type)
    return dtype if table is None else table.prefill_attention_dtype(dtype)


def splits_attention(device: torch.device) -> bool:
    """Whether attention over cached KV is split on this device: a chunk's cached prefix attended
    without a mask plus its own keys causally, and long decode runs read as views, merged by
    log-sum-exp. It pays only where the flash kernel with LSE exists (CPU); elsewhere one call
    under an explicit mask is faster."""
    return _FLASH_LSE is not None and device.type == "cpu"


def host_argmax(x: torch.Tensor) -> bool:
    """Whether x's row argmax is best taken by numpy on the host (2-D, non-empty float32 CPU
    tensors: numpy's single-threaded SIMD beats torch's parallel reduction there)."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.dim() == 2
        and x.shape[0] > 0
        and x.shape[1] > 0
    )


_INT_MM = getattr(torch, "_int_mm", None)


def int8_mm_op(device: torch.device) -> Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """torch's int8 x int8 -> int32 GEMM (`torch._int_mm(a [M, K], b [K, N])`, oneDNN on CPU, with
    VNNI / AMX-INT8 where the CPU has them) where it serves `device`: CPU only for now (CUDA's has
    shape limits, M > 16 and K, N multiples of 8, and is untested here); None elsewhere (callers
    use their exact blockwise float32 fallback)."""
    if _INT_MM is None or device.type != "cpu":
        return None
    return _INT_MM


def w8a8_linear_op(device: torch.device) -> Optional[Callable[..., Optional[torch.Tensor]]]:
    """The accelerator's own W8A8-INT8 linear for `device` (CUDA: `torch._int_mm`; NPU: torch_npu's
    quant matmul; platforms/accel_quant.py), or None (the CPU and the torch path)."""
    table = _table(device.type)
    return None if table is None else table.w8a8_linear()


def fp8_block_linear_op(device: torch.device) -> Optional[Callable[..., Optional[torch.Tensor]]]:
    """The accelerator's own FP8 block linear for `device` (CUDA: `F.scaled_mm` blockwise, after
    a self-check there; platforms/accel_fp8.py), or None (the layers' tiled widening)."""
    table = _table(device.type)
    return None if table is None else table.fp8_block_linear()


def int8_linear_kernels(device: torch.device) -> Optional[Any]:
    """The fused kernel module when its build has the W8A8-INT8 linear (`int8_linear`: per-token
    quantization, the int32 GEMM on a packed int8 weight and both scales in one call) for `device`;
    None elsewhere (callers keep `w8a8_int8_linear`'s torch ops)."""
    ops = kernels_for_device(device)
    return ops if ops is not None and hasattr(ops, "int8_linear") else None


def int8_linear_op(device: torch.device) -> Optional[Callable[..., torch.Tensor]]:
    """The fused W8A8-INT8 linear for `device` (`int8_linear_kernels`' `int8_linear`, or the copy
    of it the platform picks for its instruction set, chosen once per platform), or None."""
    table = _table(device.type)
    return None if table is None else table.int8_linear()


def kv_store_op(device: torch.device) -> Optional[Callable[..., None]]:
    """The fused `kv_store` (a layer's K / V rows into its head-major pool buffers at their slots,
    one call) for `device`'s KV pools, or None (the pool's torch path)."""
    return getattr(kernels_for_device(device), "kv_store", None)


def decode_bf16_dot(device: torch.device) -> bool:
    """Whether the fused `decode_attention` scores a bf16 pool by bf16 dot products on `device`
    (`bf16_dot=True`: the platform's `bf16_vec_kernels`, AMD's AVX512-BF16)."""
    table = _table(device.type)
    return table is not None and table.bf16_vec() is not None


def amx_linear_kernels(device: torch.device) -> Optional[Any]:
    """The fused kernel module where its bf16 linears run AMX tiles on `device` (`bf16_linear`,
    `bf16_linear_f32out`: the CPU platform's answer for an AMX CPU), or None."""
    table = _table(device.type)
    return None if table is None else table.amx_linears()
