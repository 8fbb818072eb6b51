"""Quantized GEMMs of the accelerator platforms: the torch / torch_npu calls upstream uses, behind
the W8A8-INT8 linear's interface (`kernel_dispatch.w8a8_linear_op`: (x [M, K], weight int8 [N, K],
weight_scale [N, 1], bias) -> x's dtype [M, N], the math of `w8a8_int8.w8a8_int8_linear`: per-token
symmetric int8 activations, int32 sums, both scales applied in float32).

- CUDA: `torch._int_mm` (cuBLASLt int8; needs K and N multiples of 8 and more than 16 rows, so
  decode batches are padded to 17 zero rows), the per-token quantization in torch ops. Shapes it
  cannot take return None from `CudaInt8Linear.__call__`'s guard: the caller's exact fallback runs.
- Ascend NPU: `torch_npu.npu_dynamic_quant` (per-token int8 and its scale) and
  `torch_npu.npu_quant_matmul` (int8 x int8 with the weight's per-channel scale and the per-token
  scale, output in x's dtype), as vllm-ascend and upstream SGLang's NPU path call them. A
  torch_npu without them is refused when a W8A8 model is built (`npu_w8a8_linear`), naming the
  missing call. FP8 checkpoints are refused on NPU (Ascend's matmul units take no FP8; upstream
  serves DeepSeek there from W8A8-INT8 conversions).

No GPU or NPU has run this code in this project: the tests drive it with stand-ins for `torch_npu`
and with `torch._int_mm` on CPU (which has no shape limits), and say so.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

INT8_MAX = 127.0
INT_MM_MIN_ROWS = 17  # cuBLASLt's int8 GEMM through torch._int_mm: more than 16 rows
INT_MM_MULTIPLE = 8  # ... and K, N multiples of 8

W8A8Linear = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]], Optional[torch.Tensor]
]


def per_token_quant_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 of x [M, K]: (x_q int8 [M, K], scale float32 [M, 1]); scale =
    amax(|row|) / 127 (a zero row gets 1), round half to even, clamp to +-127. The W8A8 layers'
    quantization too (`w8a8_int8` imports it from here)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    return torch.round(xf / scale).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), scale


class CudaInt8Linear:
    """The W8A8 linear on `torch._int_mm` (`int_mm` injectable for tests)."""

    def __init__(self, int_mm: Optional[Callable[..., torch.Tensor]] = None):
        self.int_mm = int_mm or torch._int_mm

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: Optional[torch.Tensor]
    ) -> Optional[torch.Tensor]:
        """x [M, K] -> [M, N] in x's dtype, or None where `_int_mm` cannot take the shapes."""
        n, k = weight.shape
        if k % INT_MM_MULTIPLE or n % INT_MM_MULTIPLE or x.dim() != 2 or x.shape[0] == 0:
            return None
        m = x.shape[0]
        q, scale = per_token_quant_int8(x)
        if m < INT_MM_MIN_ROWS:  # zero rows: their sums are 0 and are dropped
            q = torch.cat([q, q.new_zeros(INT_MM_MIN_ROWS - m, k)])
        acc = self.int_mm(q, weight.t())[:m]
        out = (acc.float() * scale * weight_scale.reshape(1, -1).float()).to(x.dtype)
        return out if bias is None else out + bias


class NpuInt8Linear:
    """The W8A8 linear on torch_npu's dynamic quantization and quant matmul (`ops`: the module)."""

    def __init__(self, ops: Any):
        self.ops = ops

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: Optional[torch.Tensor]
    ) -> Optional[torch.Tensor]:
        if x.dim() != 2 or x.shape[0] == 0:
            return None
        q, scale = self.ops.npu_dynamic_quant(x)
        out = self.ops.npu_quant_matmul(
            q,
            weight.t(),
            weight_scale.reshape(-1).float(),
            pertoken_scale=scale.reshape(-1),
            bias=None,
            output_dtype=x.dtype,
        )
        return out if bias is None else out + bias


NPU_W8A8_CALLS = ("npu_dynamic_quant", "npu_quant_matmul")


def npu_w8a8_linear(ops: Any) -> NpuInt8Linear:
    """The NPU's W8A8 linear, or ValueError naming the torch_npu calls this install lacks."""
    missing = [name for name in NPU_W8A8_CALLS if not hasattr(ops, name)]
    if missing:
        raise ValueError(
            f"W8A8-INT8 on npu needs torch_npu.{' and torch_npu.'.join(missing)}, which this torch_npu "
            "does not have: install a torch_npu release that provides them (CANN 8 or later)"
        )
    return NpuInt8Linear(ops)


def refuse_fp8_on_npu(method: str) -> None:
    """FP8 checkpoints on Ascend NPUs: refused, naming what runs there instead."""
    if method == "fp8":
        raise ValueError(
            "FP8 checkpoints are not supported on npu (Ascend's matmul units take no FP8): serve a "
            "W8A8-INT8 conversion of the model (--quantization w8a8_int8) or its bf16 weights"
        )
