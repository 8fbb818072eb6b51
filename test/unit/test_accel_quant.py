"""The accelerators' W8A8-INT8 linears (platforms/accel_quant.py) against the torch W8A8 math.

No GPU or NPU here: CUDA's path runs with `torch._int_mm` on CPU standing in for cuBLASLt's (a
recorder checks the shapes cuBLASLt needs), and the NPU's with a stand-in `torch_npu` module whose
`npu_dynamic_quant` / `npu_quant_matmul` compute the documented math in torch and check the
arguments they get. What is checked is our side: the calls, their arguments and the results."""

from __future__ import annotations

import types

import pytest
import torch

from sglang.srt.layers.quantization import w8a8_int8
from sglang.srt.layers.quantization.w8a8_int8 import (
    channel_quantize_int8,
    int8_mm_blockwise,
    per_token_quant_int8,
    w8a8_int8_linear,
)
from sglang.srt.platforms import accel_quant, npu
from sglang.srt.platforms.accel_quant import CudaInt8Linear, NpuInt8Linear, npu_w8a8_linear


def _case(m: int, k: int, n: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 3).to(dtype)
    w, s = channel_quantize_int8(torch.randn(n, k, generator=g))
    bias = torch.randn(n, generator=g).to(dtype)
    return x, w, s, bias


def _reference(x, w, s, bias):
    return w8a8_int8_linear(x, w, s, bias, mm=int8_mm_blockwise)


@pytest.mark.parametrize("m", [1, 5, 16, 17, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_int_mm_path_matches_the_w8a8_math(m, dtype):
    rows = []

    def int_mm(a, b):  # cuBLASLt's limits, asserted; torch's CPU _int_mm computes
        assert a.dtype == b.dtype == torch.int8 and a.shape[0] > 16
        assert a.shape[1] % 8 == 0 and b.shape[1] % 8 == 0
        rows.append(a.shape[0])
        return torch._int_mm(a, b.contiguous())

    x, w, s, bias = _case(m, 64, 48, dtype)
    out = CudaInt8Linear(int_mm)(x, w, s, bias)
    assert rows == [max(m, 17)] and out.dtype == dtype and out.shape == (m, 48)
    torch.testing.assert_close(out, _reference(x, w, s, bias), rtol=0, atol=0)


def test_cuda_int_mm_path_declines_shapes_cublaslt_cannot_take():
    op = CudaInt8Linear(lambda a, b: pytest.fail("called"))
    for k, n in ((60, 48), (64, 44)):
        x, w, s, bias = _case(4, k, n, torch.float32)
        assert op(x, w, s, bias) is None


class _TorchNpuStandIn(types.SimpleNamespace):
    """torch_npu's two calls as documented, in torch (a stand-in: no NPU here)."""

    def __init__(self):
        super().__init__(calls=[])

    def npu_dynamic_quant(self, x):
        q, scale = per_token_quant_int8(x)
        self.calls.append("npu_dynamic_quant")
        return q, scale.reshape(-1)  # torch_npu: the per-token scale as [M]

    def npu_quant_matmul(self, x1, x2, scale, *, pertoken_scale, bias, output_dtype):
        assert x1.dtype == x2.dtype == torch.int8 and x1.shape[1] == x2.shape[0]
        assert scale.dtype == torch.float32 and scale.shape == (x2.shape[1],)
        assert pertoken_scale.shape == (x1.shape[0],) and bias is None
        self.calls.append("npu_quant_matmul")
        acc = int8_mm_blockwise(x1, x2)
        return (acc.float() * pertoken_scale[:, None] * scale[None, :]).to(output_dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_npu_quant_matmul_path_matches_the_w8a8_math(dtype):
    ops = _TorchNpuStandIn()
    x, w, s, bias = _case(7, 40, 24, dtype)
    out = NpuInt8Linear(ops)(x, w, s, bias)
    assert ops.calls == ["npu_dynamic_quant", "npu_quant_matmul"] and out.dtype == dtype
    torch.testing.assert_close(out, _reference(x, w, s, bias), rtol=0, atol=0)


def test_npu_without_the_quant_calls_is_refused_by_name(monkeypatch):
    old = types.SimpleNamespace(npu_dynamic_quant=lambda x: None)
    with pytest.raises(ValueError, match=r"torch_npu\.npu_quant_matmul"):
        npu_w8a8_linear(old)
    monkeypatch.setattr(npu, "import_torch_npu", lambda: old)
    platform = npu.NpuPlatform()
    with pytest.raises(ValueError, match="npu_quant_matmul"):
        platform.check_quantization("w8a8_int8")
    with pytest.raises(ValueError, match="FP8 checkpoints are not supported on npu"):
        platform.check_quantization("fp8")
    platform.check_quantization(None)  # unquantized: nothing to refuse


def test_npu_platform_serves_w8a8_through_torch_npu(monkeypatch):
    ops = _TorchNpuStandIn()
    monkeypatch.setattr(npu, "import_torch_npu", lambda: ops)
    platform = npu.NpuPlatform()
    platform.check_quantization("w8a8_int8")
    assert isinstance(platform.kernels.w8a8_linear(), NpuInt8Linear)


def test_w8a8_linear_takes_the_device_op_and_falls_back_where_it_declines(monkeypatch):
    """`w8a8_int8_linear` hands x to the device's op (3-D x flattened and restored); an op that
    declines (None) leaves the torch path, as does the CPU (no op)."""
    x, w, s, bias = _case(6, 32, 16, torch.float32)
    seen = []

    def op(x2, weight, scale, b):
        seen.append(tuple(x2.shape))
        return None if len(seen) > 1 else torch.full((x2.shape[0], weight.shape[0]), 7.0)

    monkeypatch.setattr(w8a8_int8, "w8a8_linear_op", lambda device: op)
    out = w8a8_int8_linear(x.view(2, 3, 32), w, s, bias)
    assert seen == [(6, 32)] and out.shape == (2, 3, 16) and bool((out == 7).all())
    torch.testing.assert_close(w8a8_int8_linear(x, w, s, bias), _reference(x, w, s, bias), rtol=0, atol=0)
    assert len(seen) == 2
    monkeypatch.setattr(w8a8_int8, "w8a8_linear_op", lambda device: None)
    torch.testing.assert_close(w8a8_int8_linear(x, w, s, bias), _reference(x, w, s, bias), rtol=0, atol=0)


def test_fp8_refusal_names_what_runs_instead():
    with pytest.raises(ValueError, match="w8a8_int8"):
        accel_quant.refuse_fp8_on_npu("fp8")
    accel_quant.refuse_fp8_on_npu("w8a8_int8")
