"""The kernel answers of one platform object, each looked up once and kept on it.

`Platform.kernels` is a `KernelTable`: the platform's fused kernel build (`Platform.fused_kernels()`;
on CPU the import of the build the selected ISA runs, kernels/cpu/loader.py), its W8A8-INT8 linear
entry, the builds whose bf16 linears run AMX tiles or vdpbf16ps here, and the dtype its prefill
attention computes in, per input dtype. The process's platform objects are created once
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
        self._int8_linear: Any = _UNSET
        self._answers: dict[str, Any] = {}  # the platform's answers by its method's name
        self._prefill_dtype: dict[torch.dtype, torch.dtype] = {}

    def _once(self, method: str) -> Optional[Any]:
        """`self._platform.<method>()`, asked the first time only (an answer that raises is asked again)."""
        found = self._answers.get(method, _UNSET)
        if found is _UNSET:
            found = self._answers[method] = getattr(self._platform, method)()
        return found

    def fused(self) -> Optional[Any]:
        """The platform's fused kernel module, or None (callers keep their torch code)."""
        found = self._fused
        if found is _UNSET:
            with self._lock:
                if self._fused is _UNSET:
                    self._fused = self._platform.fused_kernels()
                found = self._fused
        return found

    def w8a8_linear(self) -> Optional[Any]:
        """The accelerator's own W8A8-INT8 linear (`Platform.w8a8_linear`), chosen once; None on
        platforms without one. A platform that refuses (a torch_npu without the calls) raises here
        each time it is asked."""
        return self._once("w8a8_linear")

    def fp8_block_linear(self) -> Optional[Any]:
        """The accelerator's own FP8 block linear (`Platform.fp8_block_linear`), chosen once."""
        return self._once("fp8_block_linear")

    def int8_linear(self) -> Optional[Any]:
        """The fused W8A8-INT8 linear (`int8_linear`, or the copy the platform picks for its
        instruction set: `Platform.int8_linear_entry`), chosen once; None where the build has none."""
        found = self._int8_linear
        if found is _UNSET:
            ops = self.fused()
            has = ops is not None and hasattr(ops, "int8_linear")
            found = self._int8_linear = self._platform.int8_linear_entry(ops) if has else None
        return found

    def amx_linears(self) -> Optional[Any]:
        """The fused kernel module where its bf16 linears run AMX tiles (`Platform.amx_linear_kernels`),
        chosen once; None elsewhere."""
        return self._once("amx_linear_kernels")

    def bf16_vec(self) -> Optional[Any]:
        """`Platform.bf16_vec_kernels`, chosen once."""
        return self._once("bf16_vec_kernels")

    def bf16_fma(self) -> Optional[Any]:
        """`Platform.bf16_fma_kernels`, chosen once."""
        return self._once("bf16_fma_kernels")

    def prefill_attention_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype prefill attention computes in for q / k / v of `dtype` (e.g. float32 for bf16
        on CPUs without AMX)."""
        found = self._prefill_dtype.get(dtype)
        if found is None:
            found = self._prefill_dtype[dtype] = self._platform.prefill_attention_dtype(dtype)
        return found
