"""int8_linear's SwiGLU epilogue (`swiglu=True`, kernels/cpu/csrc/int8_linear_kernel.h): a
[gate; up] weight's call returns silu(gate) * up of the values the plain call returns, with the same
bits as the plain call followed by the same build's silu_and_mul (one bf16 ulp on the portable
build, whose separate gate uses another exp), on every build this CPU runs: the vector tiles (few
rows, or K not a multiple of 64), AMX-INT8 tiles (16+ rows) with one or two row tiles, odd row
counts, biases; bad requests refused by name. The layer's use of it: test_w8a8_swiglu.py."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.layers.quantization.w8a8_int8 import channel_quantize_int8, pack_int8_vnni

# (M rows, d columns per half, K): decode rows, 16- / 32-row AMX tiles and a tail, K off the
# 64-byte AMX step (the vector tiles then), halves of one and several 16-column blocks
SHAPES = [(1, 16, 64), (3, 48, 70), (5, 96, 576), (16, 32, 128), (17, 16, 64), (33, 80, 576), (130, 48, 192)]


def _case(m: int, d: int, k: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(2 * d, k, generator=g) * 0.05
    w[d : d + 3] *= 4  # up rows of another scale than the gate's
    wq, ws = channel_quantize_int8(w)
    packed, comp, scale = pack_int8_vnni(wq, ws)
    x = (torch.randn(m, k, generator=g) * 3).bfloat16()
    b = (torch.randn(2 * d, generator=g) * 0.5).bfloat16() if bias else None
    return x, (packed, comp, scale), b


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_equals_plain_then_gate(int8_ops, shape, bias):
    m, d, k = shape
    x, (packed, comp, scale), b = _case(m, d, k, bias)
    plain = int8_ops.int8_linear(x, packed, comp, scale, 2 * d, b)
    want = int8_ops.silu_and_mul(plain)
    got = int8_ops.int8_linear(x, packed, comp, scale, 2 * d, b, swiglu=True)
    assert got.shape == (m, d) and got.dtype == torch.bfloat16
    if int8_ops.isa == "portable":
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6)
    else:
        assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    # and it is the gate: within bf16 rounding of torch's silu on the plain call's halves
    ref = torch.nn.functional.silu(plain[:, :d].float()) * plain[:, d:].float()
    torch.testing.assert_close(got.float(), ref, rtol=2**-7, atol=1e-5)


def test_swiglu_strided_rows_and_empty(int8_ops):
    x, (packed, comp, scale), _ = _case(20, 32, 64, False, seed=1)
    wide = torch.zeros(20, 80, dtype=torch.bfloat16)
    wide[:, :64] = x
    got = int8_ops.int8_linear(wide[:, :64], packed, comp, scale, 64, swiglu=True)
    assert torch.equal(got, int8_ops.int8_linear(x, packed, comp, scale, 64, swiglu=True))
    assert int8_ops.int8_linear(x[:0], packed, comp, scale, 64, swiglu=True).shape == (0, 32)


def test_swiglu_refusals(int8_ops):
    x, (packed, comp, scale), _ = _case(4, 16, 64, False)
    with pytest.raises(RuntimeError, match="swiglu needs a bfloat16 x"):
        int8_ops.int8_linear(x.float(), packed, comp, scale, 32, swiglu=True)
    w = torch.randn(48, 64) * 0.05  # halves of 24 columns: not whole 16-column blocks
    p48, c48, s48 = pack_int8_vnni(*channel_quantize_int8(w))
    with pytest.raises(RuntimeError, match="N a multiple of 32"):
        int8_ops.int8_linear(x, p48, c48, s48, 48, swiglu=True)
