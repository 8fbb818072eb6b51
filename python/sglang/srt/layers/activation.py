"""Gated activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.platforms.kernel_dispatch import fused_ops


class SiluAndMul(nn.Module):
    """[..., 2d] -> [..., d]: silu(x[..., :d]) * x[..., d:] (the SwiGLU gate of Llama MLPs)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.stride(-1) == 1:
            ops = fused_ops(x)
            if ops is not None:
                return ops.silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
