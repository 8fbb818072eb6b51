"""Choosing a CPU kernel build: the loader's pick and SGLANG_CPU_ISA, the variants a CPU runs, the
avx512 build on a Cascade Lake, one ISA vocabulary, stale and missing builds. Split from
test_cpu_kernels.py (which checks that every build this CPU runs is there and is the one it claims)."""

from __future__ import annotations

import pytest
import torch
from sglang.srt.kernels.cpu import isa, loader
from sglang.srt.platforms import fresh_platforms
from sglang.srt.platforms import kernel_dispatch as dispatch

RUNNABLE = [v.name for v in isa.runnable_variants()]


def test_loader_picks_the_best_runnable_build_and_obeys_sglang_cpu_isa(monkeypatch):
    if not all(loader.load_variant(v).module is not None for v in RUNNABLE):
        pytest.skip("not every variant is built here")
    monkeypatch.delenv("SGLANG_CPU_ISA", raising=False)
    assert loader.choose().variant == RUNNABLE[0]
    for name in RUNNABLE:
        monkeypatch.setenv("SGLANG_CPU_ISA", name)
        assert loader.load().isa() == name
    for name in isa.runnable_isas():  # every ISA of the vocabulary: the best build at or below it
        monkeypatch.setenv("SGLANG_CPU_ISA", name)
        assert loader.load().isa() == isa.build_for(name).name
    monkeypatch.setenv("SGLANG_CPU_ISA", "generic")  # the old name of portable
    assert loader.load().isa() == "portable"
    if isa.is_x86():  # an AVX2-only CPU: the avx512 builds are never chosen, and refused when asked for
        avx2_cpu = frozenset({"sse2", "avx", "avx2", "fma", "f16c"})
        monkeypatch.delenv("SGLANG_CPU_ISA")
        assert loader.choose(avx2_cpu).variant == "avx2"
        for name in ("avx512", "avx512bf16"):
            monkeypatch.setenv("SGLANG_CPU_ISA", name)
            refused = loader.choose(avx2_cpu)
            assert (
                refused.module is None
                and f"cannot run the {name} " in refused.reason
                and "avx512f" in refused.reason
            )
    monkeypatch.setenv("SGLANG_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match="SGLANG_CPU_ISA"):
        loader.choose()


def test_variants_a_cpu_runs():
    x86 = "x86_64"
    assert [v.name for v in isa.runnable_variants(flags=frozenset(), machine=x86)] == ["portable"]
    avx2_flags = frozenset({"avx2", "fma", "f16c"})
    assert [v.name for v in isa.runnable_variants(flags=avx2_flags, machine=x86)] == ["avx2", "portable"]
    assert not isa.runnable(isa.variant("avx2", x86), None)  # flags unknown: portable only
    assert [(v.name, v.cflags) for v in isa.variants("aarch64")] == [("portable", ())]
    # the avx2 build: AVX2 + FMA + F16C (its intrinsics paths' guard) and nothing of AVX-512, so
    # AVX2-only CPUs (AMD Zen 1-3) can run all of it
    avx2 = isa.variant("avx2", x86)
    assert {"-mavx2", "-mfma", "-mf16c"} <= set(avx2.cflags) and not any(
        "avx512" in f or "amx" in f for f in avx2.cflags
    )
    assert set(avx2.cpu_flags) == {"avx2", "fma", "f16c"}
    assert not any(f.startswith("-m") and f != "-march=x86-64" for f in isa.variant("portable", x86).cflags)
    assert isa.variant("generic", x86) is isa.variant("portable", x86)  # the old name
    common = (
        isa.OPS_SOURCE,
        isa.VEC_SOURCE,
        isa.LINEAR_SOURCE,
        isa.INT8_SOURCE,
        isa.BF16_LINEAR_SOURCE,
        isa.KV_STORE_SOURCE,
    )
    assert isa.variant("avx512bf16", x86).sources == common + (isa.AMX_SOURCE,)
    assert isa.variant("avx512", x86).sources == isa.variant("avx2", x86).sources == common
    assert isa.variant("portable", x86).sources == common
    with pytest.raises(ValueError, match="unknown CPU kernel variant"):
        isa.variant("sse9", x86)


def test_avx512_build_without_bf16_runs_on_cascade_lake():
    """issue 32: an AVX-512 CPU without AVX512-BF16 / AMX (Cascade Lake, Skylake-SP) runs the avx512
    build, compiled with AVX-512 F / DQ / BW / VL only (no BF16, VNNI or AMX instruction)."""
    x86 = "x86_64"
    cascade_lake = frozenset(
        {
            "sse2",
            "avx",
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512dq",
            "avx512cd",
            "avx512bw",
            "avx512vl",
            "avx512_vnni",
        }
    )
    avx512 = isa.variant("avx512", x86)
    assert {"-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl"} <= set(avx512.cflags)
    assert not any("bf16" in f or "amx" in f or "vnni" in f for f in avx512.cflags) and not avx512.with_amx
    assert [v.name for v in isa.runnable_variants(cascade_lake, x86)] == ["avx512", "avx2", "portable"]
    assert (
        isa.select("auto", cascade_lake, x86) == "avx512vnni" and isa.build_for("avx512vnni", x86) is avx512
    )
    assert (
        isa.build_for("avx2vnni", x86).name == "avx2"
        and isa.build_for("avx512bf16", x86).name == "avx512bf16"
    )
    # the best build only where the CPU has AVX512-BF16 (and VNNI, which every such CPU has)
    assert isa.runnable_variants(cascade_lake | {"avx512_bf16"}, x86)[0].name == "avx512bf16"


def test_one_isa_vocabulary_and_selector():
    """One vocabulary (sgl-kernel-npu's names), each ISA's flags a superset of the next lesser
    one's on its branch; `select` takes aliases, refuses what the CPU cannot run, and `auto` is the
    best the CPU runs."""
    x86 = "x86_64"
    names = list(isa.isas(x86))
    assert names == ["avx512bf16", "avx512vnni", "avx512", "avx2vnni", "avx2", "portable"]
    assert list(isa.isas("aarch64")) == ["portable"]
    need = {n: set(f) for n, f in isa.isas(x86).items()}
    assert need["avx512"] < need["avx512vnni"] < need["avx512bf16"] and need["avx2"] < need["avx2vnni"]
    assert need["avx2"] < need["avx512"] and need["portable"] == set()
    assert isa.parse("GENERIC") == "portable" and isa.parse("") == "auto" and isa.parse(" Avx2 ") == "avx2"
    with pytest.raises(ValueError, match="SGLANG_CPU_ISA"):
        isa.parse("avx512-bf16")
    avx2_cpu = {"avx2", "fma", "f16c"}
    assert isa.select("auto", avx2_cpu, x86) == "avx2" and isa.select("portable", avx2_cpu, x86) == "portable"
    with pytest.raises(isa.IsaNotRunnable, match="cannot run the avx2vnni kernels .missing avx_vnni"):
        isa.select("avx2vnni", avx2_cpu, x86)
    assert isa.select("auto") == isa.runnable_isas()[0]  # this CPU's flags
    assert isa.requested({"SGLANG_CPU_ISA": "generic"}) == "portable" and isa.requested({}) == "auto"


def test_a_build_older_than_its_sources_is_not_loaded(monkeypatch):
    """After an edit of csrc/ without a rebuild the old module is refused, with the command that
    rebuilds it (tests and servers would otherwise run stale code)."""
    v = isa.variant(RUNNABLE[-1])
    if loader.load_variant(v.name).module is None:
        pytest.skip("not built here")
    monkeypatch.setattr(isa, "source_tag", lambda csrc=isa.CSRC: "0123456789abcdef")
    stale = loader._import(v)
    assert stale.module is None and "older than the sources" in stale.reason and "make setup" in stale.reason


def test_a_missing_build_falls_back_to_torch_with_one_warning(monkeypatch, caplog):
    """No module for this CPU (never built, no compiler): load() warns once and returns None, and
    the dispatch table gives callers None (their torch code)."""
    missing = loader.LoadResult("none", None, "the avx2 variant is not built")
    monkeypatch.setattr(loader, "choose", lambda flags=None: missing)
    monkeypatch.setattr(loader, "_warned", set())
    with caplog.at_level("WARNING", logger=loader.__name__):
        assert loader.load() is None and loader.load() is None
    texts = [r.getMessage() for r in caplog.records]
    assert (
        texts.count("CPU kernels unavailable, using the torch implementations: the avx2 variant is not built")
        == 1
    )
    with fresh_platforms():
        assert dispatch.fused_ops(torch.zeros(2, 2)) is None
