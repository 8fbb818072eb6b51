"""RMSNorm with an optional fused residual add."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.platforms.kernel_dispatch import fused_ops


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 and cast back to x's dtype.

    `forward(x)` returns the normalised tensor. `forward(x, residual)` first forms
    `residual = x + residual` (in x's dtype, as HF does) and returns `(norm(residual), residual)`,
    which lets decoder layers carry the residual stream without an extra add per block.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, params_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=params_dtype), requires_grad=False)
        self._shape = (hidden_size,)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 or x.dtype == torch.bfloat16:
            # NOTE: torch's fused rms_norm accumulates bf16 inputs in float32 and rounds once.
            return F.rms_norm(x, self._shape, self.weight, self.variance_epsilon)
        return F.rms_norm(x.float(), self._shape, self.weight.float(), self.variance_epsilon).to(x.dtype)

    def _fused(self, x: torch.Tensor, residual: Optional[torch.Tensor]) -> Optional[Any]:
        """The fused kernels when they cover this call (2-D rows of the weight's dtype)."""
        if x.dim() != 2 or x.stride(-1) != 1 or self.weight.dtype != x.dtype:
            return None
        if residual is not None and (
            residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(-1) != 1
        ):
            return None
        return fused_ops(x)

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        ops = self._fused(x, residual)
        if ops is not None:
            if residual is None:
                return ops.rms_norm(x, self.weight, self.variance_epsilon)
            out, residual = ops.add_rms_norm(x, residual, self.weight, self.variance_epsilon)
            return out, residual
        if residual is None:
            return self._norm(x)
        residual = x + residual
        return self._norm(residual), residual

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.variance_epsilon}"
