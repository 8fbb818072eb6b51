"""benchmark/vs_vllm/step_breakdown.py's pure parts: the trace categoriser on a synthetic trace,
the rows it builds, the limit arithmetic; and `step_label` (off: a no-op; on: a trace event; a
profiler started or stopped inside a label does not break it)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "vs_vllm")
sys.path.insert(0, os.path.abspath(HERE))
step_trace = pytest.importorskip("step_trace")
step_report = pytest.importorskip("step_report")

from sglang.srt.model_executor.step_label import step_label  # noqa: E402

PYB = "<built-in method {} of pybind11_builtins.pybind11_detail_function_record object at 0x1>"


def ev(name, ts, dur, cat="python_function", tid=7):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def one_step(t0: float) -> list[dict]:
    """One decode step of a 1-layer model: 100 us schedule, a 1000 us model holding qkv (50), the
    attention kernel (200) under an attention frame, o_proj (30), RMSNorm (40), gate_up (60), down
    (70), lm head (80); then 20 us sampling, 10 us emit."""
    e = [
        ev("sched.schedule", t0, 100, "cpu_op"),
        ev("sched.forward", t0 + 100, 1100, "cpu_op"),  # traces before 2026-11-27 21:00 UTC only
        ev("runner.batch_build", t0 + 110, 40, "cpu_op"),
        ev("runner.model", t0 + 150, 1000, "cpu_op"),
        ev("sglang/srt/layers/linear.py(149): forward", t0 + 160, 60),
        ev(PYB.format("_linear_pointwise"), t0 + 165, 50),
        ev("mkldnn::_linear_pointwise", t0 + 166, 48, "cpu_op"),  # nested: not counted twice
        ev("sglang/srt/layers/attention/cpu_backend.py(212): _attend_single", t0 + 230, 300),
        ev(PYB.format("decode_attention"), t0 + 240, 200),
        ev(PYB.format("_linear_pointwise"), t0 + 550, 30),
        ev("sglang/srt/layers/layernorm.py(65): forward", t0 + 590, 50),
        ev(PYB.format("add_rms_norm"), t0 + 595, 40),
        ev(PYB.format("_linear_pointwise"), t0 + 650, 60),
        ev(PYB.format("_linear_pointwise"), t0 + 720, 70),
        ev(PYB.format("linear_f32out_packed"), t0 + 800, 80),
        ev("aten::view", t0 + 900, 5, "cpu_op"),
        ev("runner.sample", t0 + 1160, 20, "cpu_op"),
        ev("sched.process_result", t0 + 1200, 15, "cpu_op"),
        ev("sched.collect_outputs", t0 + 1215, 5, "cpu_op"),
        ev("sched.emit", t0 + 1220, 10, "cpu_op"),
    ]
    return e


def trace(steps: int = 2) -> dict:
    events = [e for i in range(steps) for e in one_step(i * 2000.0)]
    events.append(ev("aten::mm", 0, 10_000, "cpu_op", tid=99))  # another thread: ignored
    return {"traceEvents": events}


def test_steps_labels_and_kernels_are_categorised():
    spans = step_trace.main_thread_spans(trace())
    windows = step_trace.step_windows(spans)
    assert windows == [(0.0, 2000.0), (2000.0, 3230.0)]  # the last step ends at its emit
    labels = step_trace.label_times(spans, windows)
    assert labels[1]["step"] == pytest.approx(1.23)
    assert labels[0]["runner.model"] == pytest.approx(1.0)
    assert labels[0]["sched.schedule"] == pytest.approx(0.1)
    # step 0 runs until step 1's schedule: 2000 us minus 1190 us of top-level labels (the runner's
    # three count, `sched.forward` around them does not: 40 us of the runner are unlabelled)
    assert labels[0]["scheduler loop, unlabelled"] == pytest.approx(0.81)
    assert labels[1]["scheduler loop, unlabelled"] == pytest.approx(0.04)
    kernels = step_trace.model_kernel_times(spans)
    assert len(kernels) == 2
    k = kernels[0]
    assert k["gemm qkv"] == pytest.approx(0.05)
    assert k["gemm o_proj"] == pytest.approx(0.03)
    assert k["gemm gate_up"] == pytest.approx(0.06)
    assert k["gemm down"] == pytest.approx(0.07)
    assert k["gemm lm_head"] == pytest.approx(0.08)
    assert k["attention"] == pytest.approx(0.2)
    assert k["norm/rope/act"] == pytest.approx(0.04)
    assert k["other kernels"] == pytest.approx(0.005)


def test_rows_split_the_step_and_the_glue_is_the_rest_of_the_model():
    spans = step_trace.main_thread_spans(trace(1))
    labels = step_trace.mean_rows(step_trace.label_times(spans, step_trace.step_windows(spans)))
    kernels = step_trace.mean_rows(step_trace.model_kernel_times(spans))
    rows = dict(step_report.breakdown_rows(labels, kernels))
    assert rows["forward: Python / torch glue (model label minus kernels)"] == pytest.approx(1.0 - 0.535)
    assert rows["ZMQ in the scheduler: recv + emit"] == pytest.approx(0.01)
    assert sum(rows.values()) == pytest.approx(labels["step"])
    table = step_report.markdown_table("t", list(rows.items()), labels["step"], [("x", "1 ms")])
    assert "| forward: attention | 0.20 | 16.3 |" in table


def test_a_trace_without_steps_is_refused():
    with pytest.raises(ValueError, match="sched.schedule"):
        step_trace.main_thread_spans({"traceEvents": [ev("aten::mm", 0, 1, "cpu_op")]})


def test_limits_of_smollm2():
    shape = step_trace.LlamaShape(
        hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, head_dim=64, vocab=49152
    )
    assert shape.gemm_shapes()["qkv"] == (576, 960)
    layer = 30 * (576 * 960 + 576 * 576 + 576 * 3072 + 1536 * 576)
    assert shape.layer_params() == layer == 106_168_320
    need = step_trace.decode_bytes(shape, 2, batch=8, context=288, kv_bytes=2)
    assert need["weight_bytes"] == 2 * (layer + 49152 * 576)  # 269 MB of bf16 per decode step
    assert need["kv_bytes"] == 8 * 288 * 30 * 2 * 3 * 64 * 2
    flops = step_trace.prefill_flops(shape, 2048)
    assert flops["gemm_flops"] == 2 * 2048 * layer + 2 * 49152 * 576
    assert flops["attention_flops"] == 4 * 30 * 9 * 64 * 2048 * 2049 / 2
    assert step_trace.limit_ms(2e9, 1e12) == pytest.approx(2.0)


def test_weight_bytes_per_dtype_mode():
    wb = step_trace.weight_elem_bytes
    assert wb("bfloat16", 8) == 2
    assert wb("float32", 8) == 4
    avx2 = "float32 + bf16 weight copies for GEMMs of <= 1 token(s)"
    assert wb(avx2, 1) == 2 and wb(avx2, 8) == 4
    avx512 = "bfloat16 + float32 weight copies for GEMMs of >= 32 tokens"
    assert wb(avx512, 8) == 2 and wb(avx512, 2048) == 4
    assert step_trace.gemm_dtype(avx512, 2048) == "float32"


def _profiler():
    """The autograd profiler without kineto: the same enabled flag and record_function events as
    torch.profiler, without kineto's seconds of start-up."""
    return torch.autograd.profiler.profile(use_kineto=False)


def test_step_label_records_only_under_the_profiler():
    with step_label("off"):  # no profiler: nothing to record, nothing to break
        pass
    with _profiler() as prof:
        with step_label("sched.schedule"):
            torch.ones(2)
    assert "sched.schedule" in [e.name for e in prof.function_events]
    # the scheduler starts / stops the profiler inside labels (apply_messages, process_result)
    label = step_label("straddle")
    label.__enter__()
    prof = _profiler()
    prof.__enter__()
    label.__exit__(None, None, None)
    inner = step_label("inside")
    inner.__enter__()
    prof.__exit__(None, None, None)
    inner.__exit__(None, None, None)
    names = [e.name for e in prof.function_events]
    assert "straddle" not in names and "inside" in names


def test_without_the_lm_head_kernel_every_gemm_is_a_layer_gemm():
    """A label trace sees the layer GEMMs (aten ops) but not the LM head (a pybind kernel)."""
    events = [e for e in one_step(0.0) if "linear_f32out_packed" not in e["name"]]
    k = step_trace.model_kernel_times(step_trace.main_thread_spans({"traceEvents": events}))[0]
    assert k["gemm lm_head"] == 0.0 and k["gemm down"] == pytest.approx(0.07) and k["layer gemms"] == 4


def test_calibration_scales_the_stack_kernels_to_the_label_window():
    kernels = {"gemm qkv": 2.0, "gemm down": 2.0, "attention": 4.0, "layer gemms": 60}
    scaled, ratio = step_report.calibrate(kernels, layer_gemms_label_ms=2.0)
    assert ratio == pytest.approx(0.5)
    assert scaled == {"gemm qkv": 1.0, "gemm down": 1.0, "attention": 2.0}
    assert step_report.calibrate(kernels, 0.0)[1] == 1.0  # nothing to compare: unscaled


def test_kernels_longer_than_the_model_label_are_scaled_to_fit():
    labels = {"runner.model": 2.0, "sched.forward": 2.0, "step": 2.0}
    kernels = {"gemm qkv": 3.0, "attention": 1.0}
    rows = dict(step_report.breakdown_rows(labels, kernels))
    assert rows["forward: gemm qkv"] == pytest.approx(1.5) and rows["forward: attention"] == pytest.approx(
        0.5
    )
    assert rows["forward: Python / torch glue (model label minus kernels)"] == pytest.approx(0.0)
    assert step_report.kernel_fit(labels, kernels) == pytest.approx(0.5)


def test_shape_from_a_config_without_head_dim_or_kv_heads():
    cfg = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    shape = step_trace.LlamaShape.from_config(cfg | {"num_attention_heads": 4, "vocab_size": 100})
    assert (shape.head_dim, shape.kv_heads) == (16, 4)
    assert shape.gemm_shapes() == {
        "qkv": (64, 192),
        "o_proj": (64, 64),
        "gate_up": (64, 256),
        "down": (128, 64),
    }
