"""Kernel dispatch table: which kernels serve a tensor's device and dtype.

Besides our fused kernels (`fused_ops`), this is where device-specific choices among torch's own
kernels are made (`flash_lse_op`, `splits_attention`, `host_argmax`), so that layers hold no
device checks.

Layers ask `fused_ops(x)` and fall back to their torch code when it returns None, so every
platform without fused kernels (or a dtype they do not cover) keeps working unchanged. The
platform's answer is looked up once per device type and cached (building the CPU kernels takes
about half a minute the first time on a machine; later processes load the cached build).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import torch

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)

_lock = threading.Lock()
_by_device: dict[str, Optional[Any]] = {}


def kernels_for_device(device: torch.device) -> Optional[Any]:
    """The fused kernel module of the device's platform, or None."""
    module = _by_device.get(device.type, _by_device)
    if module is not _by_device:
        return module
    with _lock:
        if device.type not in _by_device:
            from sglang.srt.platforms import get_platform

            try:
                platform = get_platform(device.type)
            except ValueError:  # a device type without a platform (meta, ...)
                _by_device[device.type] = None
            else:
                _by_device[device.type] = platform.fused_kernels()
        return _by_device[device.type]


def fused_ops(x: torch.Tensor) -> Optional[Any]:
    """The fused kernels for x (its device and dtype), or None."""
    if x.dtype not in SUPPORTED_DTYPES:
        return None
    return kernels_for_device(x.device)


def reset() -> None:
    """Forget the cached answers (tests that change SGLANG_CPU_KERNELS)."""
    with _lock:
        _by_device.clear()
        _prefill_dtype.clear()


_FLASH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def flash_lse_op(q: torch.Tensor) -> Optional[Callable[..., Any]]:
    """torch's CPU flash attention, which also returns the log-sum-exp, when it serves q (CPU,
    float32 / bfloat16); None elsewhere (callers use the exact-math fallback)."""
    if _FLASH_LSE is None or q.device.type != "cpu" or q.dtype not in SUPPORTED_DTYPES:
        return None
    return _FLASH_LSE


_prefill_dtype: dict[tuple[str, torch.dtype], torch.dtype] = {}


def prefill_attention_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype torch's prefill attention runs in for q / k / v of `dtype` on `device` (the
    platform's answer, cached: e.g. float32 for bf16 on CPUs without AMX)."""
    key = (device.type, dtype)
    found = _prefill_dtype.get(key)
    if found is None:
        from sglang.srt.platforms import get_platform

        try:
            found = get_platform(device.type).prefill_attention_dtype(dtype)
        except ValueError:
            found = dtype
        _prefill_dtype[key] = found
    return found


def splits_attention(device: torch.device) -> bool:
    """Whether attention over cached KV is split on this device: a chunk's cached prefix attended
    without a mask plus its own keys causally, and long decode runs read as views, merged by
    log-sum-exp. It pays only where the flash kernel with LSE exists (CPU); elsewhere one call
    under an explicit mask is faster."""
    return _FLASH_LSE is not None and device.type == "cpu"


def host_argmax(x: torch.Tensor) -> bool:
    """Whether x's row argmax is best taken by numpy on the host (2-D, non-empty float32 CPU
    tensors: numpy's single-threaded SIMD beats torch's parallel reduction there)."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.shape[0] > 0 and x.shape[1] > 0
