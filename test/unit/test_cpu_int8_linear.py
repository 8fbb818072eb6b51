"""int8_linear (kernels/cpu/csrc/int8_linear.cpp, the fused W8A8-INT8 linear) against
`w8a8_int8_linear`'s torch path on every build this CPU runs (VNNI, maddubs on AVX-512 / AVX2,
portable loops): exact int32 sums and the same output bits, on odd shapes (tails of the 4-row tiles,
the 16-column blocks and the 4-deep k groups), zero rows, weights of -128, float32 / bf16 inputs
and biases; pack_int8_vnni's layout; the layer's dispatch (packed at prepack time, torch fallback)."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.kernels.cpu import isa, loader
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.linear_prepack import prepack_linear_weights
from sglang.srt.layers.quantization.w8a8_int8 import (
    W8A8Int8LinearMethod,
    channel_quantize_int8,
    int8_mm_blockwise,
    pack_int8_vnni,
    w8a8_int8_linear,
)
from sglang.srt.platforms import fresh_platforms, get_platform

# (M rows of x, N output columns, K): decode and prefill-like rows, K not a multiple of 4 / 16 / 64
# (AMX-INT8 tiles, where the CPU has them: 16+ rows and K a multiple of 64, 16- and 32-row tiles, one
# or two blocks)
SHAPES = [(1, 37, 53), (3, 129, 70), (17, 1031, 131), (130, 61, 1537), (1, 16, 4), (5, 33, 1)]
SHAPES += [(16, 16, 64), (17, 47, 128), (130, 61, 576), (64, 1030, 192)]
IMPLS = {  # the product path of each build (+amx: AMX-INT8 tiles for 16+ rows where the CPU has them)
    "avx512bf16": ("avx512-vnni", "avx512-vnni+amx"),
    "avx512": ("avx512-maddubs",),
    "avx2": ("avx2-maddubs",),
    "portable": ("portable",),
}


@pytest.fixture(scope="module", params=[v.name for v in isa.runnable_variants()])
def ops(request):
    result = loader.load_variant(request.param)
    if result.module is None:
        pytest.skip(f"CPU kernels: {result.reason} (test_cpu_kernels.py fails for a missing build)")
    assert result.module.int8_linear_impl() in IMPLS[request.param]
    return result.module


def _weight(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    wq, ws = channel_quantize_int8(torch.randn(n, k, generator=g) * 0.1)
    wq[n // 2, : min(k, 7)] = -128  # a checkpoint may hold -128 (|w| = 128 in the maddubs path)
    return wq, ws


def test_pack_layout():
    w = torch.arange(-60, 60, dtype=torch.int8)[:, None].repeat(1, 6)[:20]  # [20, 6]
    w[:, 5] = 3
    scale = torch.rand(20, 1)
    packed, comp, s = pack_int8_vnni(w, scale)
    assert packed.shape == (2, 2, 16, 4) and comp.shape == s.shape == (32,)
    assert packed[1, 1, 2, 1].item() == w[18, 5].item()  # block 1, k group 1, lane 2: row 18, k 4 + 1
    assert packed[1, 1, 2, 2].item() == 0 and packed[1, :, 4:].eq(0).all()  # K and N padding
    assert comp[3].item() == 128 * int(w[3].sum()) and comp[20:].eq(0).all()
    assert torch.equal(s[:20], scale.reshape(-1)) and s[20:].eq(0).all()


@pytest.mark.parametrize("shape", SHAPES)
def test_int32_sums_exact(ops, shape):
    """x rows of integers with amax 127 quantize to themselves (scale 1); weight scale 1: the
    output is the int32 sum itself, exactly (|sum| < 2**24 here)."""
    m, n, k = shape
    g = torch.Generator().manual_seed(m * n + k)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    a[:, 0] = 127
    w, _ = _weight(n, k, m + n)
    packed, comp, s = pack_int8_vnni(w, torch.ones(n, 1))
    out = ops.int8_linear(a.float(), packed, comp, s, n)
    assert torch.equal(out.double(), (a.long() @ w.long().t()).double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_equals_torch_path(ops, shape, dtype):
    m, n, k = shape
    g = torch.Generator().manual_seed(m + n * k)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4).to(dtype)
    x[m // 2] = 0  # a zero row: scale 1, output 0 (+ bias)
    w, ws = _weight(n, k, n)
    packed, comp, s = pack_int8_vnni(w, ws)
    bias = torch.randn(n, generator=g).to(dtype)
    for b in (None, bias):
        # the exact int32 GEMM of the fallback: torch._int_mm returns garbage for K = 1 (torch 2.13)
        want = w8a8_int8_linear(x, w, ws, b, mm=int8_mm_blockwise)
        got = ops.int8_linear(x, packed, comp, s, n, b)
        assert got.dtype == dtype and got.shape == (m, n)
        # the same int32 sums and float rounding: equal bits (tolerance 0)
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert not ops.int8_linear(x, packed, comp, s, n)[m // 2].any()


def test_kernel_strided_empty_and_refusals(ops):
    w, ws = _weight(6, 64, 1)
    packed, comp, s = pack_int8_vnni(w, ws)
    x = torch.randn(4, 80)[:, 8:72]  # rows with a stride of 80
    torch.testing.assert_close(
        ops.int8_linear(x, packed, comp, s, 6), w8a8_int8_linear(x, w, ws), atol=0, rtol=0
    )
    assert ops.int8_linear(torch.randn(0, 64), packed, comp, s, 6).shape == (0, 6)
    with pytest.raises(RuntimeError, match="packed must be"):
        ops.int8_linear(torch.randn(2, 68), packed, comp, s, 6)
    with pytest.raises(RuntimeError, match="float32 / bfloat16"):
        ops.int8_linear(torch.randn(2, 64).half(), packed, comp, s, 6)
    with pytest.raises(RuntimeError, match="bias"):
        ops.int8_linear(torch.randn(2, 64), packed, comp, s, 6, torch.randn(6).bfloat16())


def _layer(n: int, k: int, bias: bool, dtype: torch.dtype) -> ReplicatedLinear:
    layer = ReplicatedLinear(k, n, bias=bias, params_dtype=dtype)
    W8A8Int8LinearMethod().create_weights(layer, "layer")
    w, ws = _weight(n, k, 3)
    layer.weight.data.copy_(w)
    layer.weight_scale.data.copy_(ws)
    if bias:
        layer.bias.data.normal_()
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_packs_at_prepack_and_matches_torch_path(dtype):
    layer = _layer(45, 70, True, dtype)
    x = torch.randn(2, 3, 70).to(dtype)
    want = layer(x)  # not packed yet: the torch path
    holder = torch.nn.Sequential(layer)
    nbytes = prepack_linear_weights(holder, get_platform("cpu"))
    if get_platform("cpu").kernels.fused() is None:
        assert layer.int8_packed is None and nbytes == 0
    else:
        assert layer.int8_packed is not None and nbytes >= 45 * 70
    torch.testing.assert_close(layer(x), want, atol=0, rtol=0)
    layer.bias.data = layer.bias.data.float()  # a bias of another dtype: added after, as torch does
    torch.testing.assert_close(layer(x), w8a8_int8_linear(x, layer.weight, layer.weight_scale, layer.bias))


def test_layer_without_kernels_keeps_torch_path(monkeypatch):
    monkeypatch.setenv("SGLANG_CPU_KERNELS", "0")
    with fresh_platforms():
        layer = _layer(20, 33, False, torch.bfloat16)
        assert prepack_linear_weights(torch.nn.Sequential(layer), get_platform("cpu")) == 0
        assert layer.int8_packed is None
        x = torch.randn(4, 33).bfloat16()
        torch.testing.assert_close(
            layer(x), w8a8_int8_linear(x, layer.weight, layer.weight_scale), atol=0, rtol=0
        )
