"""The kernel answers of one platform object, each looked up once and kept on it.

`Platform.kernels` is a `KernelTable`: the platform's fused kernel build (`Platform.fused_kernels()`;
on CPU the import of the build the selected ISA runs, kernels/cpu/loader.py) and the dtype its
prefill attention computes in, per input dtype. The process's platform objects are created once
(`platforms.get_platform`, at start-up by `rank_device.bind_rank`), so each answer is looked up once
per process; `kernel_dispatch.py` is how layers ask for them by a tensor's device.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import torch

_UNSET = object()


class KernelTable:
    def __init__(self, platform: Any) -> None:
        self._platform = platform
        self._lock = threading.Lock()
        self._fused: Any = _UNSET
        self._prefill_dtype: dict[torch.dtype, torch.dtype] = {}

    def fused(self) -> Optional[Any]:
        """The platform's fused kernel module, or None (callers keep their torch code)."""
        found = self._fused
        if found is _UNSET:
            with self._lock:
                if self._fused is _UNSET:
                    self._fused = self._platform.fused_kernels()
                found = self._fused
        return found

    def prefill_attention_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype prefill attention computes in for q / k / v of `dtype` (e.g. float32 for bf16
        on CPUs without AMX)."""
        found = self._prefill_dtype.get(dtype)
        if found is None:
            found = self._prefill_dtype[dtype] = self._platform.prefill_attention_dtype(dtype)
        return found
