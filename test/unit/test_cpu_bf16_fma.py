"""bf16 linears on CPUs without bf16 dot products: on AVX-512 without BF16 (the `avx512` kind:
Cascade Lake / Skylake-SP) and on AVX2 the avx512 / avx2 build's `bf16_linear` (each packed bf16
weight pair widened by a shift and a mask, float32 FMAs; kernels/cpu/csrc/bf16_linear.cpp) is the
platform's packed bf16 linear, under an explicit bf16 dtype at every row count and under
`--dtype auto` (a bf16 model on both kinds then) below the float32 copies' threshold. The kinds are emulated by
SGLANG_CPU_FLAGS_OVERRIDE / SGLANG_CPU_ISA on any CPU that runs the build.
The kernel's own parity (every shape, bias, the SwiGLU epilogue) is test_cpu_bf16_linear.py's and
test_cpu_bf16_swiglu.py's on every build this CPU runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.configs.model_config import resolve_dtype
from sglang.srt.kernels.cpu import isa
from sglang.srt.layers.linear_bf16_packed import Bf16PackedLinear
from sglang.srt.layers.linear_mixed import Float32PrefillWeight, float32_prefill_linear
from sglang.srt.platforms import cpu, cpu_linears, fresh_platforms, get_platform

CPU = torch.device("cpu")


def _emulate(monkeypatch, kind: str):
    if kind not in [v.name for v in isa.runnable_variants()]:
        pytest.skip(f"this CPU does not run the {kind} kernel build")
    monkeypatch.setenv("SGLANG_CPU_ISA", kind)
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", kind)
    platform = get_platform("cpu")
    if platform.kernels.fused() is None:
        pytest.skip(f"the {kind} kernel build is not built here (test_cpu_kernels.py fails for it)")
    return platform


@pytest.mark.parametrize("kind", ["avx512", "avx2"])
def test_the_fma_path_is_the_packed_bf16_linear(monkeypatch, kind):
    with fresh_platforms():
        _check_fma_path(_emulate(monkeypatch, kind), f"{kind}-fma")


def _check_fma_path(platform, impl: str) -> None:
    ops = platform.kernels.fused()
    assert ops.bf16_linear_impl() == impl
    assert platform.kernels.bf16_fma() is ops
    assert platform.kernels.bf16_vec() is None and platform.kernels.amx_linears() is None
    resolve_dtype("bfloat16", None, device="cpu")
    pack, kernel = platform.prepacked_linear(torch.bfloat16, CPU)
    assert isinstance(kernel, Bf16PackedLinear)
    g = torch.Generator().manual_seed(0)
    w, bias = torch.randn(96, 72, generator=g).bfloat16(), torch.randn(96, generator=g).bfloat16()
    calls = []
    entry = kernel.entry
    kernel.entry = lambda *a: calls.append(a[0].shape[0]) or entry(*a)
    for rows in (1, 9, 300):  # every row count takes the kernel under an explicit bf16
        x = torch.randn(rows, 72, generator=g).bfloat16()
        want = F.linear(x.float(), w.float(), bias.float())
        torch.testing.assert_close(kernel(x, pack(w), bias).float(), want, atol=0.05, rtol=0.02)
    assert calls == [1, 9, 300]
    plain = ops.bf16_linear(x, pack(w)[0], 96, None, False)
    assert torch.equal(kernel.swiglu(x, pack(w), None), ops.silu_and_mul(plain))


@pytest.mark.parametrize(
    "kind, min_rows",
    [("avx512", cpu_linears.BF16_FMA_FLOAT32_MIN_ROWS), ("avx2", cpu_linears.BF16_FMA_AVX2_FLOAT32_MIN_ROWS)],
)
def test_auto_is_bf16_with_float32_prefill_copies(monkeypatch, kind, min_rows):
    """With its kernel build, both kinds' `--dtype auto` is a bf16 model whose calls below the
    kind's threshold take the FMA path and larger ones float32 weight copies (prefill chunks)."""
    with fresh_platforms():
        platform = _emulate(monkeypatch, kind)
        assert resolve_dtype("auto", None, device="cpu") == torch.bfloat16
        assert platform.dtype_choice.kind == kind
        pack, kernel = platform.prepacked_linear(torch.bfloat16, CPU)
        assert kernel is float32_prefill_linear
        w = torch.randn(80, 48).bfloat16()
        packed = pack(w)
        assert isinstance(packed, Float32PrefillWeight) and isinstance(packed.small_kernel, Bf16PackedLinear)
        assert packed.min_tokens == min_rows > cpu.FLOAT32_GEMM_MIN_TOKENS
        for rows in (1, 8, min_rows):
            x = torch.randn(rows, 48).bfloat16()
            torch.testing.assert_close(
                kernel(x, packed, None).float(), F.linear(x.float(), w.float()), atol=0.05, rtol=0.02
            )


def test_without_the_fma_path_avx2_auto_stays_float32(monkeypatch):
    """An AVX2 kind whose kernel build has no FMA path (here: the kind overridden while the
    machine's own build runs; or SGLANG_CPU_KERNELS=0): float32 with one-row bf16 copies."""
    with fresh_platforms():
        monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", "avx2")
        monkeypatch.delenv("SGLANG_CPU_ISA", raising=False)
        monkeypatch.setenv("SGLANG_CPU_KERNELS", "0")
        assert resolve_dtype("auto", None, device="cpu") == torch.float32
        assert get_platform("cpu").dtype_choice.bf16_gemm_max_tokens == 1


def test_only_the_fma_kinds_take_it(monkeypatch):
    """The FMA path is the avx512 and avx2 kinds' only, each on its own build (the kind after
    SGLANG_CPU_ISA's cap: the avx512 build emulates a CPU without BF16): AVX512-BF16 kinds
    (vdpbf16ps or oneDNN) and the portable build never hand it out."""
    seen = set()
    for variant in isa.runnable_variants():
        for kind in ("amx", "avx512-bf16", "avx512", "avx2"):
            monkeypatch.setenv("SGLANG_CPU_ISA", variant.name)
            monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", kind)
            with fresh_platforms():
                platform = get_platform("cpu")
                effective = cpu.cpu_kind(cpu.effective_cpu_flags())
                fma = platform.kernels.bf16_fma()
                assert (fma is not None) == (effective == variant.name in ("avx512", "avx2")), (
                    variant.name,
                    kind,
                )
                seen.add(effective)
    assert "avx2" in seen
