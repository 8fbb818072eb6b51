"""linear_f32out_packed (kernels/cpu/csrc/linear_f32out_packed.cpp) against its torch reference on
every build this CPU runs, pack_bf16_pairs, and float32_out_linear (layers/linear_float32_out.py:
the float32 LM head) on its kernel, blocked and float32-weight paths."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.kernels.cpu import reference as ref
from sglang.srt.layers import linear_float32_out as l32
from sglang.srt.layers.vocab_embedding import ParallelLMHead

# (rows of x, weight rows, K): tails of every tile (4 rows of x on AVX-512, 2 on AVX2; blocks of
# 32 weight rows, taken two at a time on AVX-512; a half block), decode and LM-head-like shapes
SHAPES = [
    (1, 1, 1),
    (1, 37, 576),
    (2, 5, 19),
    (3, 16, 40),
    (5, 64, 64),
    (7, 130, 33),
    (9, 100, 128),
    (33, 67, 96),
]


def _dense(x, w, bias=None):
    return torch.nn.functional.linear(x.float(), w.float(), bias)


def test_pack_layout_round_trips():
    w = torch.randn(70, 9).bfloat16()
    packed = l32.pack_bf16_pairs(w)
    assert packed.dtype == torch.int32 and packed.shape == (3, 9, 16)
    lo = packed[1, 4, 5].item() & 0xFFFF  # block 1, column 4, lane 5: rows 32 + 5 and 48 + 5
    hi = (packed[1, 4, 5].item() >> 16) & 0xFFFF
    assert lo == w[37, 4].view(torch.int16).item() & 0xFFFF
    assert hi == w[53, 4].view(torch.int16).item() & 0xFFFF
    assert (packed[2, :, 6:] >> 16).eq(0).all()  # rows 70.. are padding
    x = torch.randn(2, 9)
    torch.testing.assert_close(ref.linear_f32out_packed(x, packed, 70), _dense(x, w))


@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_reference(ops, shape):
    n, N, K = shape
    g = torch.Generator().manual_seed(n * 1000 + N + K)
    x = torch.randn(n, K, generator=g)
    w = torch.randn(N, K, generator=g).bfloat16()
    bias = torch.randn(N, generator=g)
    packed = l32.pack_bf16_pairs(w)
    for b in (None, bias):
        out = ops.linear_f32out_packed(x, packed, N, b)
        assert out.dtype == torch.float32 and out.shape == (n, N)
        # float32 sums in another order: ~K * 1e-7 relative; bf16 weights are widened exactly
        torch.testing.assert_close(out, _dense(x, w, b), atol=1e-4, rtol=1e-5)


def test_kernel_is_float32_where_bf16_rounds(ops):
    """Logit-sized outputs that bf16 cannot hold: the kernel keeps them, a bf16 GEMM would not."""
    x = torch.full((1, 64), 0.25)
    w = torch.full((3, 64), 1.0).bfloat16()
    w[1, 0] = 1.0078125  # one bf16 step above 1: the dot product is 16.0019..., between bf16's 16 and 16.125
    out = ops.linear_f32out_packed(x, l32.pack_bf16_pairs(w), 3)
    assert out[0, 1].item() == pytest.approx(16.001953125, abs=1e-6)
    assert out[0, 1] != out[0, 0]


def test_kernel_strided_rows_empty_and_refusals(ops):
    w = torch.randn(6, 64).bfloat16()
    packed = l32.pack_bf16_pairs(w)
    x = torch.randn(4, 80)[:, 8:72]  # rows with a stride of 80
    torch.testing.assert_close(ops.linear_f32out_packed(x, packed, 6), _dense(x, w), atol=1e-4, rtol=1e-5)
    assert ops.linear_f32out_packed(torch.randn(0, 64), packed, 6).shape == (0, 6)
    with pytest.raises(RuntimeError, match="packed must be"):
        ops.linear_f32out_packed(torch.randn(2, 63), packed, 6)
    with pytest.raises(RuntimeError, match="packed must be"):
        ops.linear_f32out_packed(torch.randn(2, 64), packed, 40)  # 40 rows need two blocks
    with pytest.raises(RuntimeError, match="float32"):
        ops.linear_f32out_packed(torch.randn(2, 64).bfloat16(), packed, 6)
    with pytest.raises(RuntimeError, match="bias"):
        ops.linear_f32out_packed(torch.randn(2, 64), packed, 6, torch.randn(3))


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_float32_out_linear_paths(monkeypatch, rows):
    """The kernel (packed), the blocked path (small blocks to cross several) and a float32 weight
    all give the float32 product."""
    monkeypatch.setattr(l32, "BLOCK_ROWS", 7)
    x = torch.randn(rows, 48).bfloat16()
    w = torch.randn(30, 48).bfloat16()
    bias = torch.randn(30).bfloat16()
    want = _dense(x, w, bias.float())
    packed = l32.float32_logits_packing(w)
    for p in (None, packed):
        got = l32.float32_out_linear(x.view(1, rows, 48), w, bias, p)
        assert got.dtype == torch.float32 and got.shape == (1, rows, 30)
        torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(l32.float32_out_linear(x, w.float(), bias), want, atol=1e-4, rtol=1e-5)


def test_lm_head_switch():
    head = ParallelLMHead(50, 16, params_dtype=torch.bfloat16)
    head.weight.data.normal_()
    h = torch.randn(3, 16).bfloat16()
    assert head.compute_logits(torch.randn(3, 16).bfloat16()).dtype == torch.bfloat16
    head.packed_weight = "the bf16 GEMM copy"
    packed = l32.float32_logits_packing(head.weight)
    head.set_float32_logits(packed)
    assert head.packed_weight is None or packed is None  # the kernel's copy replaces the GEMM's
    logits = head.compute_logits(h)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, _dense(h, head.weight), atol=1e-4, rtol=1e-5)
