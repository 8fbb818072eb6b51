"""CUDA platform: nccl, `torch.cuda` streams and memory."""

from __future__ import annotations

from typing import Any

import torch

from sglang.srt.platforms.accel_fp8 import checked_fp8_block_linear
from sglang.srt.platforms.accel_quant import CudaInt8Linear
from sglang.srt.platforms.base import AcceleratorPlatform


class CudaPlatform(AcceleratorPlatform):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    dsa_ops_impl = "triton"  # the Triton DSA kernels of sgl_kernel_npu

    @classmethod
    def is_available(cls) -> bool:
        return torch.cuda.is_available()

    def module(self) -> Any:
        return torch.cuda

    def w8a8_linear(self) -> Any:
        """W8A8-INT8 on `torch._int_mm` (platforms/accel_quant.py)."""
        return CudaInt8Linear()

    def fp8_block_linear(self) -> Any:
        """FP8 block linears on `F.scaled_mm`'s blockwise recipes, once a self-check on this
        device passed (platforms/accel_fp8.py); else None (the tiled widening path)."""
        return checked_fp8_block_linear(self.current_device())
