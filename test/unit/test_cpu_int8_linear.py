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
    int8_weight,
    channel_quantize_int8,
    int8_mm_blockwise,
    pack_int8_vnni,
    w8a8_int8_linear,
)
from sglang.srt.platforms import fresh_platforms, get_platform
from sglang.srt.platforms.kernel_dispatch import int8_linear_op

# (M rows of x, N output columns, K): decode and prefill-like rows, K not a multiple of 4 / 16 / 64
# (AMX-INT8 tiles, where the CPU has them: 16+ rows and K a multiple of 64, 16- and 32-row tiles, one
# or two blocks)
SHAPES = [(1, 37, 53), (3, 129, 70), (17, 1031, 131), (130, 61, 1537), (1, 16, 4), (5, 33, 1)]
SHAPES += [(16, 16, 64), (17, 47, 128), (130, 61, 576), (64, 1030, 192)]


@pytest.fixture(scope="module")
def ops(int8_ops):
    """Every ISA this CPU runs (conftest.py's int8_ops)."""
    return int8_ops


def test_isa_request_picks_the_vnni_copy(monkeypatch):
    """SGLANG_CPU_ISA=avx512vnni / avx2vnni run the avx512 / avx2 build's VNNI copy; avx512 / avx2
    the build's own maddubs path; the platform hands the W8A8 layers that choice."""
    for name in isa.runnable_isas():
        if name not in ("avx512vnni", "avx512", "avx2vnni", "avx2"):
            continue
        monkeypatch.setenv("SGLANG_CPU_ISA", name)
        with fresh_platforms():
            op = int8_linear_op(torch.device("cpu"))
            module = get_platform("cpu").kernels.fused()
            if module is None:
                pytest.skip(f"the {isa.build_for(name).name} build is missing")
            want = module.int8_linear_vnni if isa.has_vnni(name) else module.int8_linear
            assert op is want, name


def test_the_entry_is_chosen_once_per_platform(monkeypatch):
    """Every W8A8 layer asks int8_linear_op; the platform picks its entry once (KernelTable)."""
    with fresh_platforms():
        platform, calls = get_platform("cpu"), []
        pick = platform.int8_linear_entry
        monkeypatch.setattr(platform, "int8_linear_entry", lambda ops: calls.append(ops) or pick(ops))
        first = int8_linear_op(torch.device("cpu"))
        assert all(int8_linear_op(torch.device("cpu")) is first for _ in range(3))
        assert len(calls) == (0 if first is None else 1)


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


@pytest.mark.parametrize("m", [1, 40])
def test_denormal_outputs_round_like_torch(ops, m):
    """Weight scales so small that outputs are float32 denormals: the bf16 rounding keeps them as
    torch does (the AVX512-BF16 conversion reads denormals as zero; such vectors take the other path)."""
    n, k = 48, 128
    w, ws = _weight(n, k, 5)
    ws[3], ws[20], ws[33] = 1e-39, 3e-41, 1e-37
    packed, comp, s = pack_int8_vnni(w, ws)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
    want = w8a8_int8_linear(x, w, ws, mm=int8_mm_blockwise)
    assert ((want.float().abs() < 1.18e-38) & (want != 0)).any()  # denormal outputs present
    assert torch.equal(ops.int8_linear(x, packed, comp, s, n), want)
    bias = torch.randn(n).bfloat16() * 1e-38
    assert torch.equal(
        ops.int8_linear(x, packed, comp, s, n, bias), w8a8_int8_linear(x, w, ws, bias, mm=int8_mm_blockwise)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_packs_at_prepack_and_matches_torch_path(dtype):
    layer = _layer(45, 70, True, dtype)
    x = torch.randn(2, 3, 70).to(dtype)
    want = layer(x)  # not packed yet: the torch path
    plain = layer.weight.detach().clone()
    holder = torch.nn.Sequential(layer)
    nbytes = prepack_linear_weights(holder, get_platform("cpu"))
    if get_platform("cpu").kernels.fused() is None:
        assert layer.int8_packed is None and nbytes == 0 and not layer.weight.is_meta
    else:
        # the packed copy replaces the plain weight: only its padding (48 x 72 - 45 x 70 bytes), sums
        # and scales (48 x 4 bytes each) are added
        assert layer.int8_packed is not None and layer.weight.is_meta
        assert nbytes == 48 * 72 - 45 * 70 + 2 * 48 * 4
        assert layer.weight.shape == (45, 70) and layer.weight.dtype == torch.int8
    assert torch.equal(int8_weight(layer), plain)
    assert prepack_linear_weights(holder, get_platform("cpu")) == 0  # packed once
    assert layer.quant_method.pack_weights(layer) is None  # nothing packed again: not counted
    torch.testing.assert_close(layer(x), want, atol=0, rtol=0)
    layer.bias.data = layer.bias.data.float()  # a bias of another dtype: added after, as torch does
    torch.testing.assert_close(layer(x), w8a8_int8_linear(x, plain, layer.weight_scale, layer.bias))
    # x of a dtype the fused kernel does not take (float16): the torch path's bits, packed or not
    torch.testing.assert_close(
        layer(x.half()), w8a8_int8_linear(x.half(), plain, layer.weight_scale, layer.bias), atol=0, rtol=0
    )


def test_float16_runs_the_packed_weight_widened(monkeypatch):
    """A float16 x runs the fused kernel on x widened to float32 (no unpacked copy of the weight
    per call), rounded to float16, the bias added after: the torch path's bits."""
    if get_platform("cpu").kernels.fused() is None:
        pytest.skip("no CPU kernel build here")
    from sglang.srt.layers.quantization import w8a8_int8

    for bias in (False, True):
        layer = _layer(45, 70, bias, torch.float16)
        plain = layer.weight.detach().clone()
        prepack_linear_weights(torch.nn.Sequential(layer), get_platform("cpu"))
        assert layer.int8_packed is not None
        x = (torch.randn(5, 70) * 3).half()
        want = w8a8_int8_linear(x, plain, layer.weight_scale, layer.bias)
        with monkeypatch.context() as m:
            m.setattr(w8a8_int8, "unpack_int8_vnni", lambda *a: pytest.fail("unpacked per call"))
            got = layer(x)
        assert got.dtype == torch.float16 and torch.equal(got, want)


def test_layer_without_kernels_keeps_torch_path(monkeypatch):
    monkeypatch.setenv("SGLANG_CPU_KERNELS", "0")
    with fresh_platforms():
        layer = _layer(20, 33, False, torch.bfloat16)
        assert prepack_linear_weights(torch.nn.Sequential(layer), get_platform("cpu")) == 0
        assert layer.int8_packed is None and layer.quant_method.pack_weights(layer) is None
        x = torch.randn(4, 33).bfloat16()
        torch.testing.assert_close(
            layer(x), w8a8_int8_linear(x, layer.weight, layer.weight_scale), atol=0, rtol=0
        )
