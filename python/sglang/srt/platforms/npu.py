"""Ascend NPU platform: hccl, `torch.npu` (registered by torch_npu, imported lazily here only)."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Optional

import torch

from sglang.srt.platforms.accel_quant import npu_w8a8_linear, refuse_fp8_on_npu
from sglang.srt.platforms.base import AcceleratorPlatform


def import_torch_npu() -> Any:
    """Import torch_npu (registers `torch.npu` and the hccl backend); ImportError explains how to get it."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError as e:
        raise ImportError(
            "the npu platform needs torch_npu: install the torch_npu release for your CANN version (pip install torch-npu)"
        ) from e


class NpuPlatform(AcceleratorPlatform):
    name = "npu"
    device_type = "npu"
    dist_backend = "hccl"
    dsa_ops_impl = (
        "torch_npu"  # CANN's fused ops (torch_npu.npu_lightning_indexer / npu_sparse_flash_attention)
    )

    @classmethod
    def is_available(cls) -> bool:
        if importlib.util.find_spec("torch_npu") is None:
            return False
        try:
            import_torch_npu()
            return bool(torch.npu.is_available())  # type: ignore[attr-defined]
        except Exception:  # a broken CANN install means "not available", not a crash
            return False

    def module(self) -> Any:
        import_torch_npu()
        return torch.npu  # type: ignore[attr-defined]

    def w8a8_linear(self) -> Any:
        """W8A8-INT8 on torch_npu's npu_dynamic_quant + npu_quant_matmul (platforms/accel_quant.py)."""
        return npu_w8a8_linear(import_torch_npu())

    def check_quantization(self, method: Optional[str]) -> None:
        """FP8 refused; W8A8-INT8 needs torch_npu's quant calls (refused naming the missing ones)."""
        refuse_fp8_on_npu(method or "")
        if method == "w8a8_int8":
            self.kernels.w8a8_linear()
