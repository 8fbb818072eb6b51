"""linear_f32out (kernels/cpu/csrc/linear_f32out.cpp) against its torch reference on every build
this CPU runs, and float32_out_linear (layers/linear_float32_out.py: the float32 LM head) on its
kernel, blocked and float32-weight paths."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.kernels.cpu import isa, loader
from sglang.srt.kernels.cpu import reference as ref
from sglang.srt.layers import linear_float32_out as l32
from sglang.srt.layers.vocab_embedding import ParallelLMHead

DTYPES = (torch.float32, torch.bfloat16)
# (rows of x, weight rows, K): tails of every tile (4 rows of x on AVX-512, 2 on AVX2; 4 weight
# rows), K below / between / above a vector (16 / 8 lanes), decode and LM-head-like shapes
SHAPES = [(1, 1, 1), (1, 37, 576), (2, 5, 19), (3, 13, 40), (5, 9, 64), (7, 130, 33), (9, 100, 128), (32, 67, 96)]


@pytest.fixture(scope="module", params=[v.name for v in isa.runnable_variants()])
def ops(request):
    result = loader.load_variant(request.param)
    if result.module is None:
        pytest.skip(f"CPU kernels: {result.reason} (test_cpu_kernels.py fails for a missing build)")
    return result.module


@pytest.mark.parametrize("w_dtype", DTYPES)
@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_reference(ops, shape, x_dtype, w_dtype):
    n, N, K = shape
    g = torch.Generator().manual_seed(n * 1000 + N + K)
    x = torch.randn(n, K, generator=g).to(x_dtype)
    w = torch.randn(N, K, generator=g).to(w_dtype)
    bias = torch.randn(N, generator=g)
    for b in (None, bias):
        out = ops.linear_f32out(x, w, b)
        assert out.dtype == torch.float32 and out.shape == (n, N)
        # float32 sums in another order: ~K * 1e-7 relative; bf16 operands are widened exactly
        torch.testing.assert_close(out, ref.linear_f32out(x, w, b), atol=1e-4, rtol=1e-5)


def test_kernel_is_float32_where_bf16_rounds(ops):
    """Logit-sized outputs that bf16 cannot hold: the kernel keeps them, a bf16 GEMM would not."""
    x = torch.full((1, 64), 0.25)
    w = torch.full((3, 64), 1.0).bfloat16()
    w[1, 0] = 1.0078125  # one bf16 step above 1: the dot product is 16.0019..., between bf16's 16 and 16.125
    out = ops.linear_f32out(x, w)
    assert out[0, 1].item() == pytest.approx(16.001953125, abs=1e-6)
    assert out[0, 1] != out[0, 0]


def test_kernel_strided_rows_and_empty(ops):
    base = torch.randn(4, 80)
    x = base[:, 8:72]  # rows with a stride of 80
    w = torch.randn(6, 100).bfloat16()[:, :64]
    torch.testing.assert_close(ops.linear_f32out(x, w), ref.linear_f32out(x, w), atol=1e-4, rtol=1e-5)
    assert ops.linear_f32out(torch.randn(0, 64), w).shape == (0, 6)
    bias = torch.randn(6)
    torch.testing.assert_close(ops.linear_f32out(torch.randn(2, 0), torch.randn(6, 0), bias), bias.expand(2, 6))


def test_kernel_refuses_bad_arguments(ops):
    w = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="columns"):
        ops.linear_f32out(torch.randn(2, 7), w)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ops.linear_f32out(torch.randn(2, 8).half(), w)
    with pytest.raises(RuntimeError, match="contiguous rows"):
        ops.linear_f32out(torch.randn(8, 2).t(), w)
    with pytest.raises(RuntimeError, match="bias"):
        ops.linear_f32out(torch.randn(2, 8), w, torch.randn(3))


@pytest.mark.parametrize("rows", [1, l32.KERNEL_MAX_ROWS, l32.KERNEL_MAX_ROWS + 5])
def test_float32_out_linear_paths(monkeypatch, rows):
    """The kernel (small batches), the blocked path (more rows; small blocks to cross several) and
    a float32 weight all give the float32 product."""
    monkeypatch.setattr(l32, "BLOCK_ROWS", 7)
    x = torch.randn(rows, 48).bfloat16()
    w = torch.randn(30, 48).bfloat16()
    bias = torch.randn(30).bfloat16()
    want = ref.linear_f32out(x, w, bias)
    got = l32.float32_out_linear(x.view(1, rows, 48), w, bias)
    assert got.dtype == torch.float32 and got.shape == (1, rows, 30)
    torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(l32.float32_out_linear(x, w.float(), bias), want, atol=1e-4, rtol=1e-5)


def test_lm_head_switch():
    head = ParallelLMHead(50, 16, params_dtype=torch.bfloat16)
    head.weight.data.normal_()
    h = torch.randn(3, 16).bfloat16()
    assert head.compute_logits(h).dtype == torch.bfloat16
    head.float32_logits = True
    logits = head.compute_logits(h)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, ref.linear_f32out(h, head.weight), atol=1e-4, rtol=1e-5)
