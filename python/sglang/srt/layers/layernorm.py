"""RMSNorm with an optional fused residual add, and the float32 residual stream of half models."""

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

    Float32 residual stream (`set_float32_residual`, on by default on CPU: `--disable-fp32-residual`):
    under bf16 weights the layer input starts the stream in float32 (`residual_from`), each sum
    `x + residual` stays float32 (unrounded) and only the normed output is bf16. bf16 sums rounded
    at every one of a model's layers move near-tied logits by more than their gap (the default
    model's demo answer on the amx kind, issue 32)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, params_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=params_dtype), requires_grad=False)
        self._shape = (hidden_size,)
        self.float32_residual = False

    def set_float32_residual(self) -> None:
        """Start residual streams in float32 (`residual_from`); a no-op for float32 weights."""
        self.float32_residual = self.weight.dtype != torch.float32

    def residual_from(self, x: torch.Tensor) -> torch.Tensor:
        """The residual stream's first value: the layer input, in float32 under `float32_residual`."""
        return x.float() if self.float32_residual else x

    def _norm(self, x: torch.Tensor, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        out_dtype = out_dtype or x.dtype
        if x.dtype == self.weight.dtype == out_dtype and x.dtype in (torch.float32, torch.bfloat16):
            # NOTE: torch's fused rms_norm accumulates bf16 inputs in float32 and rounds once.
            return F.rms_norm(x, self._shape, self.weight, self.variance_epsilon)
        return F.rms_norm(x.float(), self._shape, self.weight.float(), self.variance_epsilon).to(out_dtype)

    def _fused(self, x: torch.Tensor, residual: Optional[torch.Tensor]) -> Optional[Any]:
        """The fused kernels when they cover this call (2-D rows of the weight's dtype; a float32
        residual under bf16 rows)."""
        if x.dim() != 2 or x.stride(-1) != 1 or self.weight.dtype != x.dtype:
            return None
        if residual is not None and (
            residual.shape != x.shape
            or residual.stride(-1) != 1
            or not (
                residual.dtype == x.dtype or (residual.dtype == torch.float32 and x.dtype == torch.bfloat16)
            )
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
        residual = x + residual  # float32 when the stream is (type promotion), else x's dtype
        return self._norm(residual, x.dtype), residual

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.variance_epsilon}" + (
            ", float32 residual" if self.float32_residual else ""
        )


def use_float32_residual(model: nn.Module, server_args, platform) -> bool:
    """Switch every RMSNorm of `model` to a float32 residual stream where the flags / platform ask
    for it (--enable-fp32-residual, or the platform's default unless --disable-fp32-residual);
    returns whether the model's stream is now float32 (never for float32 weights: nothing to do)."""
    on = server_args.enable_fp32_residual or (
        platform.float32_residual_by_default and not server_args.disable_fp32_residual
    )
    switched = False
    if on:
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.set_float32_residual()
                switched = switched or module.float32_residual
    return switched
