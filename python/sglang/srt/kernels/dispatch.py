"""Kernel dispatch table: which fused kernels serve a tensor's device and dtype.

Layers ask `fused_ops(x)` and fall back to their torch code when it returns None, so every
platform without fused kernels (or a dtype they do not cover) keeps working unchanged. The
platform's answer is looked up once per device type and cached (building the CPU kernels takes
about half a minute the first time on a machine; later processes load the cached build).
"""

from __future__ import annotations

import threading
from typing import Any, Optional

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
