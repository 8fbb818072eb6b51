"""FP8 block linears on CUDA's `F.scaled_mm` blockwise recipes (platforms/accel_fp8.py).

No GPU here: the GEMM is a stand-in that checks the recipes and scale shapes it is given and
computes the documented blockwise math in torch (CPU's `F.scaled_mm` takes no blockwise recipe).
Checked on our side: the activations' per-token-group FP8 quantization, the call, the self-check
that gates the op (a failing or wrong GEMM is not taken), and the layers' dispatch to it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.quantization import fp8_block
from sglang.srt.platforms.accel_fp8 import (
    CudaFp8BlockLinear,
    checked_fp8_block_linear,
    fp8_block_reference,
    per_token_group_fp8,
)


def _stand_in_scaled_mm(a, b, scale_a, recipe_a, scale_b, recipe_b, output_dtype):
    assert recipe_a == F.ScalingType.BlockWise1x128 and recipe_b == F.ScalingType.BlockWise128x128
    assert a.dtype == b.dtype == torch.float8_e4m3fn
    m, k = a.shape
    n = b.shape[1]
    assert scale_a.shape == (m, k // 128) and scale_b.shape == (n // 128, k // 128)
    return fp8_block_reference(a, scale_a, b.t(), scale_b, output_dtype)


def _case(m=7, n=256, k=384, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[0, :128] = 0  # an all-zero group: scale 1
    w = torch.randn(n, k, generator=g) * 0.05
    scale_inv = w.abs().view(n // 128, 128, k // 128, 128).amax(dim=(1, 3)) / 448
    wq = (w / scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1)).to(torch.float8_e4m3fn)
    return x, wq, scale_inv


def test_per_token_group_fp8_scales_each_group_to_the_fp8_range():
    x, _, _ = _case()
    q, s = per_token_group_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (7, 3) and float(s[0, 0]) == 1.0
    back = q.float().view(7, 3, 128) * s.view(7, 3, 1)
    assert (
        float((back.view(7, 384) - x).abs().max()) <= float(x.abs().max()) / 448 * 32
    )  # e4m3: 3 mantissa bits
    assert float(q.float().abs().amax()) == 448.0


def test_scaled_mm_path_is_the_blockwise_math_and_near_the_weight_only_path():
    x, w, s = _case()
    bias = torch.randn(256)
    out = CudaFp8BlockLinear(_stand_in_scaled_mm)(x, w, s, (128, 128), bias)
    want = fp8_block_reference(*per_token_group_fp8(x), w, s, torch.float32) + bias
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    weight_only = fp8_block.fp8_block_linear(x, w, s, (128, 128), bias)
    rel = float((out - weight_only).norm() / weight_only.norm())
    assert 0 < rel < 0.06  # the activations' FP8 rounding, and nothing else


def test_shapes_the_recipes_do_not_take_are_declined():
    op = CudaFp8BlockLinear(lambda *a, **k: pytest.fail("called"))
    x, w, s = _case()
    assert op(x, w, s, (64, 128), None) is None
    assert op(x[:, :200], w[:, :200], s, (128, 128), None) is None


def test_the_self_check_gates_the_op():
    assert checked_fp8_block_linear(torch.device("cpu"), CudaFp8BlockLinear(_stand_in_scaled_mm)) is not None

    def raises(*a, **k):
        raise RuntimeError("no blockwise scaled_mm on this device")

    assert checked_fp8_block_linear(torch.device("cpu"), CudaFp8BlockLinear(raises)) is None
    wrong = CudaFp8BlockLinear(lambda *a, **k: 1.1 * _stand_in_scaled_mm(*a, **k))  # 10 % off
    assert checked_fp8_block_linear(torch.device("cpu"), wrong) is None


def test_fp8_layers_take_the_device_op_and_keep_the_tiled_path_where_it_declines(monkeypatch):
    x, w, s = _case()
    op = CudaFp8BlockLinear(_stand_in_scaled_mm)
    monkeypatch.setattr(fp8_block, "fp8_block_linear_op", lambda device: op)
    got = fp8_block.fp8_block_linear(x.view(7, 1, 384), w, s, (128, 128))
    assert got.shape == (7, 1, 256)
    torch.testing.assert_close(got.view(7, 256), op(x, w, s, (128, 128), None), rtol=0, atol=0)
    monkeypatch.setattr(fp8_block, "fp8_block_linear_op", lambda device: lambda *args: None)  # declines
    declined = fp8_block.fp8_block_linear(x, w, s, (128, 128))
    monkeypatch.setattr(fp8_block, "fp8_block_linear_op", lambda device: None)
    torch.testing.assert_close(declined, fp8_block.fp8_block_linear(x, w, s, (128, 128)), rtol=0, atol=0)
