"""`--dtype auto` on CPU: the dtype chosen per CPU kind (flags simulated with
SGLANG_CPU_FLAGS_OVERRIDE or given directly), the start-up log line, the ISA caps used to emulate an
AVX2 machine, explicit dtypes honoured, and the mixed bf16 / float32 linear."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.configs.model_config import resolve_dtype
from sglang.srt.layers import linear_mixed
from sglang.srt.platforms import cpu, cpu_kinds, fresh_platforms, get_platform
from sglang.srt.platforms import kernel_dispatch as dispatch

AMD_EPYC_ROME = (  # /proc/cpuinfo flags of an AVX2-only AMD EPYC (Zen 2), abridged
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
    "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl pni pclmulqdq ssse3 fma cx16 "
    "sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy abm sse4a "
    "misalignsse 3dnowprefetch bmi1 avx2 smep bmi2 rdseed adx smap clflushopt clwb sha_ni xsaveopt"
)
SAPPHIRE_RAPIDS = AMD_EPYC_ROME + (
    " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8"
)
SKYLAKE_X = AMD_EPYC_ROME + " avx512f avx512dq avx512cd avx512bw avx512vl"
COOPER_LAKE = SKYLAKE_X + " avx512_vnni avx512_bf16"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """(Each test also has platform objects of its own: test/conftest.py.)"""
    for name in ("SGLANG_CPU_FLAGS_OVERRIDE", "SGLANG_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "flags, kind, dtype, bf16_copies, f32_copies",
    [
        (SAPPHIRE_RAPIDS, "amx", torch.bfloat16, False, False),
        (COOPER_LAKE, "avx512-bf16", torch.bfloat16, False, True),
        (SKYLAKE_X, "avx512", torch.bfloat16, False, True),
        (AMD_EPYC_ROME, "avx2", torch.float32, True, False),
        ("fpu sse sse2 ssse3 sse4_1 sse4_2", "generic", torch.float32, True, False),
        ("", "generic", torch.float32, True, False),
    ],
)
def test_choice_per_cpu_kind(monkeypatch, flags, kind, dtype, bf16_copies, f32_copies):
    choice = cpu.choose_dtype(flags.split())
    assert (choice.kind, choice.dtype) == (kind, dtype)
    assert (choice.bf16_gemm_max_tokens is not None) == bf16_copies
    assert (choice.float32_gemm_min_tokens is not None) == f32_copies
    assert choice.reason
    # the same through the override env var (a flag list, commas allowed) and through resolve_dtype
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", ",".join(flags.split()) or " ")
    if flags:
        assert cpu.cpu_kind(cpu.effective_cpu_flags()) == kind
        assert resolve_dtype("auto", None, device="cpu") == dtype


ZEN5 = COOPER_LAKE + " avx512_vbmi2 avx512_bitalg avx512_vpopcntdq avx512_vp2intersect avx_vnni"


@pytest.mark.parametrize(
    "flags, vendor, f32_copies",
    [(ZEN5, "AuthenticAMD", False), (ZEN5, "GenuineIntel", True), (COOPER_LAKE, "GenuineIntel", True)],
)
def test_avx512_bf16_choice_by_vendor(flags, vendor, f32_copies):
    """AMD's AVX512-BF16 (Zen 4 / 5) runs bf16 dot products at twice the float32 rate: bf16 GEMMs at
    every size there; Intel's without AMX keeps float32 copies for prefill-sized GEMMs."""
    choice = cpu.choose_dtype(flags.split(), vendor=vendor)
    assert (choice.kind, choice.dtype) == ("avx512-bf16", torch.bfloat16)
    assert (choice.float32_gemm_min_tokens is not None) == f32_copies
    assert choice.bf16_gemm_max_tokens is None


def test_vendor_read_from_cpuinfo_and_ignored_under_an_override(tmp_path, monkeypatch):
    from sglang.srt.kernels.cpu import isa

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2\n")
    assert isa.cpu_vendor(str(info)) == "AuthenticAMD"
    assert isa.cpu_vendor(str(tmp_path / "missing")) == ""
    monkeypatch.setattr(cpu_kinds, "_proc_cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(cpu_kinds, "_proc_cpu_flags", lambda: frozenset(ZEN5.split()))
    assert cpu.choose_dtype().float32_gemm_min_tokens is None  # this CPU's vendor
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", "avx512-bf16")  # an emulated kind: no vendor
    assert cpu.choose_dtype().float32_gemm_min_tokens is not None


@pytest.mark.parametrize("kind", cpu.CPU_KINDS)
def test_override_by_kind_name(monkeypatch, kind):
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", kind)
    assert cpu.choose_dtype().kind == kind
    assert cpu.cpu_kind(cpu.KIND_FLAGS[kind]) == kind


@pytest.mark.parametrize("isa_name, kind", sorted(cpu.KIND_ALIASES.items()))
def test_override_by_isa_name(monkeypatch, isa_name, kind):
    """The kernels' ISA names (kernels/cpu/isa.py) of the kinds work in the override too, and each
    kind's flags run the kernels of that ISA."""
    from sglang.srt.kernels.cpu import isa

    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", isa_name)
    assert cpu.choose_dtype().kind == kind
    assert isa.select("auto", cpu.KIND_FLAGS[kind], machine="x86_64") == isa_name


def test_isa_caps_emulate_older_cpus(monkeypatch):
    """ONEDNN_MAX_CPU_ISA / SGLANG_CPU_ISA: an AMX machine run as an AVX2 (or AVX-512) one is
    treated as the machine it emulates."""
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", "amx")
    assert cpu.choose_dtype().kind == "amx"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert cpu.choose_dtype().kind == "avx512-bf16"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI")
    assert cpu.choose_dtype().kind == "avx512"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cpu.choose_dtype().kind == "avx2"
    monkeypatch.setenv("SGLANG_CPU_ISA", "avx2")  # oneDNN's cap given: our kernels' ISA caps nothing more
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert cpu.choose_dtype().kind == "avx512"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cpu.choose_dtype().kind == "avx2"
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert cpu.choose_dtype().kind == "avx2"
    monkeypatch.setenv("SGLANG_CPU_ISA", "generic")  # the old name of portable
    assert cpu.choose_dtype().kind == "generic"
    monkeypatch.setenv("SGLANG_CPU_ISA", "portable")
    assert cpu.choose_dtype().kind == "generic"
    monkeypatch.setenv("SGLANG_CPU_ISA", "avx512")  # AVX-512 without BF16 (Cascade Lake's build)
    assert cpu.choose_dtype().kind == "avx512"
    monkeypatch.setenv("SGLANG_CPU_ISA", "avx512vnni")
    assert cpu.choose_dtype().kind == "avx512"
    monkeypatch.setenv("SGLANG_CPU_ISA", "avx2vnni")
    assert cpu.choose_dtype().kind == "avx2"
    monkeypatch.setenv("SGLANG_CPU_ISA", "avx512bf16")  # not a cap: the kernels' best build (AMX inside)
    assert cpu.choose_dtype().kind == "amx"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert cpu.choose_dtype().kind == "avx2"


def test_proc_flags_are_read_once(monkeypatch):
    calls = []
    from sglang.srt.kernels.cpu import isa

    cpu_kinds._proc_cpu_flags.cache_clear()
    monkeypatch.setattr(
        isa, "cpu_flags", lambda path="/proc/cpuinfo": calls.append(path) or frozenset({"avx2", "fma"})
    )
    try:
        assert cpu.choose_dtype().kind == "avx2"
        assert cpu.choose_dtype().kind == "avx2"
        assert len(calls) == 1
    finally:
        cpu_kinds._proc_cpu_flags.cache_clear()


def test_log_line_and_state(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=cpu.__name__)
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", "avx2")
    assert resolve_dtype("auto", None, device="cpu") == torch.float32
    lines = [r.getMessage() for r in caplog.records if "--dtype auto" in r.getMessage()]
    assert len(lines) == 1
    assert "(avx2): float32 + bf16 weight copies" in lines[0] and "reason: AVX2" in lines[0]
    platform = get_platform("cpu")  # the platform object resolve_dtype asked: it holds the choice
    assert platform.dtype_choice is not None and platform.dtype_choice.kind == "avx2"
    backend = platform.prepacked_linear(torch.float32, torch.device("cpu"))
    assert backend is not None and backend[1] is linear_mixed.mixed_linear
    assert (
        cpu.CpuPlatform().prepacked_linear(torch.float32, torch.device("cpu")) is None
    )  # another object: no choice
    caplog.clear()
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", "amx")
    resolve_dtype("auto", None, device="cpu")
    (line,) = [r.getMessage() for r in caplog.records if "--dtype auto" in r.getMessage()]
    assert "(amx): bfloat16;" in line and "AMX" in line
    backend = platform.prepacked_linear(torch.bfloat16, torch.device("cpu"))
    assert backend is None or backend[1] not in (
        linear_mixed.mixed_linear,
        linear_mixed.float32_prefill_linear,
    )
    caplog.clear()
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", "avx512-bf16")
    resolve_dtype("auto", None, device="cpu")
    (line,) = [r.getMessage() for r in caplog.records if "--dtype auto" in r.getMessage()]
    assert "(avx512-bf16): bfloat16 + float32 weight copies for GEMMs of >= 32 tokens" in line
    backend = platform.prepacked_linear(torch.bfloat16, torch.device("cpu"))
    assert backend is not None and backend[1] is linear_mixed.float32_prefill_linear


def test_choice_is_the_platform_objects_and_a_fresh_one_has_none(monkeypatch):
    """The auto choice lives on the process's platform object (no module state): fresh platform
    objects start without it, and the earlier ones keep theirs."""
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", "avx2")
    resolve_dtype("auto", None, device="cpu")
    outer = get_platform("cpu")
    assert outer.dtype_choice.kind == "avx2" and get_platform("cpu") is outer
    with fresh_platforms():
        inner = get_platform("cpu")
        assert inner is not outer and inner.dtype_choice is None
        assert inner.prepacked_linear(torch.float32, torch.device("cpu")) is None
    assert get_platform("cpu") is outer and outer.dtype_choice.kind == "avx2"


def test_mixed_linears_share_one_budget_per_choice():
    """The backends of one choice pack against one copy budget; another choice starts its own."""
    mixed = linear_mixed.MixedLinears(copy_budget_bytes=48 * 40 * 2)
    pack, kernel = mixed.bf16_copies(1)
    assert mixed.bf16_copies(1) == (pack, kernel) and kernel is linear_mixed.mixed_linear
    assert pack(torch.randn(48, 40)).bf16 is not None and pack(torch.randn(48, 40)).bf16 is None
    assert mixed.copies_kept() == (1, 48 * 40 * 2, 1)
    pack32, kernel32 = mixed.float32_prefill(16)
    assert (
        kernel32 is linear_mixed.float32_prefill_linear
        and pack32(torch.randn(8, 4).bfloat16()).float32 is None
    )
    assert linear_mixed.MixedLinears().bf16_copies(1)[0](torch.randn(48, 40)).bf16 is not None


@pytest.mark.parametrize("kind", ["avx2", "avx512-bf16", "amx"])
def test_explicit_dtype_is_honoured(monkeypatch, kind):
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", kind)
    resolve_dtype("auto", None, device="cpu")  # an earlier auto choice in this process...
    assert resolve_dtype("float32", None, device="cpu") == torch.float32
    platform = get_platform("cpu")
    assert platform.dtype_choice is None  # ...is dropped: explicit bf16 / float32 run plain GEMMs
    assert platform.prepacked_linear(torch.float32, torch.device("cpu")) is None
    assert resolve_dtype("bfloat16", None, device="cpu") == torch.bfloat16
    backend = platform.prepacked_linear(torch.bfloat16, torch.device("cpu"))
    assert backend is None or backend[1] not in (
        linear_mixed.mixed_linear,
        linear_mixed.float32_prefill_linear,
    )
    with pytest.raises(ValueError, match="float16"):
        resolve_dtype("float16", None, device="cpu")


def test_auto_on_gpu_keeps_the_config_dtype():
    class Cfg:
        torch_dtype = "float16"

    assert resolve_dtype("auto", Cfg(), device="cuda") == torch.float16
    Cfg.torch_dtype = torch.bfloat16
    assert resolve_dtype("auto", Cfg(), device="cuda") == torch.bfloat16
    Cfg.torch_dtype = "float32"
    assert resolve_dtype("auto", Cfg(), device="cuda") == torch.bfloat16


@pytest.mark.parametrize("keep_copy", [True, False])
def test_mixed_linear(monkeypatch, keep_copy):
    """One token: the bf16 copy (input rounded to bf16, float32 result); more: the float32 weight
    itself, exactly F.linear."""
    budget = linear_mixed.CopyBudget()
    monkeypatch.setattr(budget, "take", lambda nbytes: keep_copy)
    torch.manual_seed(0)
    w = torch.randn(48, 40) * 0.1
    b = torch.randn(48)
    packed = linear_mixed.pack(w, max_tokens=1, budget=budget)
    assert (packed.bf16 is not None) == keep_copy
    one = torch.randn(1, 40)
    out = linear_mixed.mixed_linear(one, packed, b)
    assert out.dtype == torch.float32
    if keep_copy:
        ref = F.linear(one.bfloat16().double(), w.bfloat16().double(), b.double()).float()
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-2)
        assert not torch.equal(out, F.linear(one, w, b))  # it did go through bf16
    else:
        torch.testing.assert_close(out, F.linear(one, w, b), rtol=0, atol=0)
    two = torch.randn(2, 40)
    torch.testing.assert_close(linear_mixed.mixed_linear(two, packed, b), F.linear(two, w, b), rtol=0, atol=0)
    torch.testing.assert_close(linear_mixed.mixed_linear(two, packed, None), F.linear(two, w), rtol=0, atol=0)


def test_mixed_copy_budget():
    budget = linear_mixed.CopyBudget(100)
    assert budget.take(60) and not budget.take(60) and budget.take(40)
    assert (budget.kept, budget.kept_bytes, budget.skipped) == (2, 100, 1)


@pytest.mark.parametrize("keep_copy", [True, False])
def test_float32_prefill_linear(monkeypatch, keep_copy):
    """bf16 model: below the threshold the small-input kernel itself (plain F.linear here); from it
    on a float32 GEMM on the float32 copy, rounded to bf16 once (or the bf16 GEMM without a copy)."""
    budget = linear_mixed.CopyBudget()
    monkeypatch.setattr(budget, "take", lambda nbytes: keep_copy)
    torch.manual_seed(0)
    w = (torch.randn(48, 40) * 0.1).bfloat16()
    b = torch.randn(48).bfloat16()
    packed = linear_mixed.pack_float32_prefill(w, min_tokens=16, budget=budget)
    assert (packed.float32 is not None) == keep_copy
    small = torch.randn(15, 40).bfloat16()
    torch.testing.assert_close(
        linear_mixed.float32_prefill_linear(small, packed, b), F.linear(small, w, b), rtol=0, atol=0
    )
    big = torch.randn(16, 40).bfloat16()
    out = linear_mixed.float32_prefill_linear(big, packed, b)
    assert out.dtype == torch.bfloat16
    ref = F.linear(big.float(), w.float(), b.float()).bfloat16() if keep_copy else F.linear(big, w, b)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize(
    "kind, want", [("amx", torch.bfloat16), ("avx512-bf16", torch.float32), ("avx2", torch.float32)]
)
def test_prefill_attention_dtype_per_kind(monkeypatch, kind, want):
    """bf16 prefill attention computes in float32 on CPUs without AMX (torch's bf16 flash kernel
    is slower there); float32 stays float32 everywhere. (The answer is the platform object's: this
    test's own, test/conftest.py.)"""
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", kind)
    assert dispatch.prefill_attention_dtype(torch.device("cpu"), torch.bfloat16) == want
    assert dispatch.prefill_attention_dtype(torch.device("cpu"), torch.float32) == torch.float32


@pytest.mark.parametrize("vendor, want", [("AuthenticAMD", torch.bfloat16), ("GenuineIntel", torch.float32)])
def test_prefill_attention_dtype_by_vendor(monkeypatch, vendor, want):
    """AMD's AVX512-BF16 keeps bf16 prefill attention (its bf16 dot products beat float32 FMAs)."""
    monkeypatch.setattr(cpu_kinds, "_proc_cpu_vendor", lambda: vendor)
    monkeypatch.setattr(cpu_kinds, "_proc_cpu_flags", lambda: frozenset(ZEN5.split()))
    with fresh_platforms():
        assert dispatch.prefill_attention_dtype(torch.device("cpu"), torch.bfloat16) == want


def test_bf16_prefill_through_float32_matches_float32(monkeypatch):
    """The cpu backend's bf16 prefill on a non-AMX kind equals float32 SDPA on the same
    (bf16-rounded) inputs, rounded once to bf16 at the end: no bf16 probabilities in between."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.cpu_backend import CPUAttnBackend, CPUMetadata, _ExtendItem

    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", "avx512-bf16")
    with fresh_platforms():  # (a fresh platform object besides the test's own: asked after the override)
        assert dispatch.prefill_attention_dtype(torch.device("cpu"), torch.bfloat16) == torch.float32
        g = torch.Generator().manual_seed(0)
        n, h, hk, d = 300, 6, 2, 64
        q, k, v = (torch.randn(n, x * d, generator=g).to(torch.bfloat16) for x in (h, hk, hk))
        layer = SimpleNamespace(
            num_heads=h, num_kv_heads=hk, head_dim=d, v_head_dim=d, scaling=d**-0.5, layer_id=0
        )
        md = CPUMetadata(False, None, None, None, [_ExtendItem(0, n, None, None, True)])
        out = torch.empty(n, h, d, dtype=torch.bfloat16)
        CPUAttnBackend._attend_extends(q.view(n, h, d), k, v, layer, None, md, out)
        ref = (
            F.scaled_dot_product_attention(
                *(t.float().view(n, -1, d).transpose(0, 1).unsqueeze(0) for t in (q, k, v)),
                is_causal=True,
                scale=d**-0.5,
                enable_gqa=True,
            )[0]
            .transpose(0, 1)
            .to(torch.bfloat16)
        )
        assert torch.equal(out, ref)
