"""benchmark/vs_vllm: one docs section per CPU kind (replaced per kind), the CPU / dtype / load in
the section, vLLM's default dtype per kind, no run of ours on stale kernel builds."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "vs_vllm")
sys.path.insert(0, os.path.abspath(HERE))
report = pytest.importorskip("report")
servers = pytest.importorskip("servers")


def _results(kind: str, tps: float, emulated: bool = False) -> dict:
    cpu = {
        "kind": kind,
        "model": "Some CPU",
        "native_kind": "avx512-bf16" if emulated else kind,
        "emulated": emulated,
        "emulation_env": {"ONEDNN_MAX_CPU_ISA": "AVX2"} if emulated else {},
        "flags": {"avx2": True, "avx512f": kind != "avx2", "avx512_bf16": False, "amx": False},
    }
    meta = {
        "date": "2026-11-25",
        "command": "run.py",
        "machine": "m",
        "load_before": "1.00, 1, 1",
        "repeats": 1,
        "vllm_config": "v",
        "ours_args": "",
        "ours_ttft_args": "",
        "cpu": cpu,
        "ours_dtype": "auto",
        "vllm_dtype": None if emulated else "float32",
    }
    entry = {"median": {"output_throughput": tps, "median_ttft_ms": 10.0}, "load_before": "2.50, 2, 2"}
    return {"workloads": {"a": "A", "d": "D"}, "meta": meta, "ours": {"a": entry, "d": entry}}


def test_one_section_per_kind(tmp_path):
    docs = tmp_path / "benchmarks.md"
    docs.write_text(
        "# B\n\n<!-- vs_vllm:amx:begin -->\nold amx\n<!-- vs_vllm:amx:end -->\n\nnotes\n\n## Later\nx\n"
    )
    report.update_docs(str(docs), report.section(_results("avx2", 11.0, emulated=True), "p.png"), "avx2")
    report.update_docs(str(docs), report.section(_results("avx512", 22.0), "q.png"), "avx512")
    report.update_docs(str(docs), report.section(_results("avx2", 33.0, emulated=True), "p.png"), "avx2")
    text = docs.read_text()
    assert text.count("vs_vllm:avx2:begin") == 1 and text.count("vs_vllm:avx512:begin") == 1
    assert "old amx" in text and "33.0" in text and "11.0" not in text and "22.0" in text
    assert text.index("notes") < text.index("vs_vllm:avx2:begin") < text.index("## Later")
    avx2 = text[text.index("vs_vllm:avx2:begin") : text.index("vs_vllm:avx2:end")]
    assert "**emulated**" in avx2 and "ONEDNN_MAX_CPU_ISA=AVX2" in avx2 and "vLLM not run" in avx2
    assert "Some CPU (avx2 yes, avx512f no, avx512_bf16 no, amx no)" in avx2
    assert "| 2.50 / — |" in avx2  # the load before the workload
    assert "(d) D" in avx2


def test_vllm_best_dtype():
    assert servers.vllm_best_dtype("amx") == servers.vllm_best_dtype("avx512-bf16") == "bfloat16"
    assert servers.vllm_best_dtype("avx512") == servers.vllm_best_dtype("avx2") == "float32"


def test_cpu_info_follows_emulation(monkeypatch):
    for name in ("SGLANG_CPU_FLAGS_OVERRIDE", "SGLANG_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)
    native = servers.cpu_info()
    assert not native["emulated"] and native["kind"] == native["native_kind"]
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", "generic")
    info = servers.cpu_info()
    assert info["kind"] == "generic" and info["flags"]["avx2"] is False
    assert info["emulated"] == (native["native_kind"] != "generic")


def test_a_run_of_ours_on_stale_kernels_is_refused(tmp_path):
    """A server whose kernel builds are older than their sources fell back to the torch code: the
    comparison refuses its figures instead of recording that path as ours."""
    clean = tmp_path / "clean.log"
    clean.write_text("[... Scheduler rank 0] INFO steps 10, prefill 100.0 tok/s\n")
    servers.require_fresh_kernels(str(clean))
    stale = tmp_path / "stale.log"
    stale.write_text(
        "[... Scheduler rank 0] WARNING CPU kernels unavailable, using the torch implementations: the "
        "avx512bf16 build is older than the sources in csrc/ (built from aa, now bb); build them\n"
    )
    with pytest.raises(RuntimeError, match="without its CPU kernels"):
        servers.require_fresh_kernels(str(stale))
