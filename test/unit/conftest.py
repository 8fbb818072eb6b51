"""Fixtures shared by the CPU kernel tests of this folder."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang.srt.kernels.cpu import isa, loader


@pytest.fixture(scope="module", params=[v.name for v in isa.runnable_variants()])
def ops(request):
    """Each kernel build this CPU runs (a missing one is skipped here: test_cpu_kernels.py, whose own
    `ops` fails for it, is the check that every build is there)."""
    result = loader.load_variant(request.param)
    if result.module is None:
        pytest.skip(f"CPU kernels: {result.reason} (test_cpu_kernels.py fails for a missing build)")
    return result.module


IMPLS = {  # the product path of each ISA (+amx: AMX-INT8 tiles for 16+ rows where the CPU has them)
    "avx512bf16": ("avx512-vnni", "avx512-vnni+amx"),
    "avx512vnni": ("avx512-vnni",),  # the avx512 build's VNNI copy (int8_linear_vnni)
    "avx512": ("avx512-maddubs",),
    "avx2vnni": ("avx2-vnni",),  # the avx2 build's AVX-VNNI copy
    "avx2": ("avx2-maddubs",),
    "portable": ("portable",),
}


@pytest.fixture(scope="module", params=isa.runnable_isas())
def int8_ops(request):
    """Every ISA this CPU runs: its build's int8_linear, or the build's VNNI copy for the VNNI ISAs
    (what `CpuPlatform.int8_linear_entry` picks under SGLANG_CPU_ISA=<isa>)."""
    build = isa.build_for(request.param).name
    result = loader.load_variant(build)
    if result.module is None:
        pytest.skip(f"CPU kernels: {result.reason} (test_cpu_kernels.py fails for a missing build)")
    module = result.module
    vnni_copy = isa.has_vnni(request.param) and hasattr(module, "int8_linear_vnni")
    impl = module.int8_linear_vnni_impl() if vnni_copy else module.int8_linear_impl()
    assert impl in IMPLS[request.param]
    return SimpleNamespace(
        int8_linear=module.int8_linear_vnni if vnni_copy else module.int8_linear,
        silu_and_mul=module.silu_and_mul,
        isa=request.param,
    )
