"""Ascend NPU platform: hccl, `torch.npu` (registered by torch_npu, imported lazily here only)."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch

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
