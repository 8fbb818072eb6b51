"""`step_breakdown.py`'s tables: per-step ms by category (from the two traces and the HTTP-side
timings) with the physical limits next to them. Pure functions of the measured numbers."""

from __future__ import annotations

from step_trace import LAYER_GEMMS

SCHED_ROWS = (
    ("scheduler: schedule (policy, KV alloc, worker batch)", "sched.schedule"),
    ("scheduler: process_result", "sched.process_result"),
    ("scheduler: collect_outputs", "sched.collect_outputs"),
    ("scheduler: apply_messages", "sched.apply_messages"),
    ("scheduler loop and model runner, unlabelled", "scheduler loop, unlabelled"),
    ("batch building (ForwardBatch + attention metadata)", "runner.batch_build"),
    ("sampling (batch info, sampler, .tolist())", "runner.sample"),
    ("ZMQ in the scheduler: recv + emit", None),
)
KERNEL_ROWS = LAYER_GEMMS + ("gemm lm_head", "attention", "norm/rope/act", "embedding", "other kernels")


def breakdown_rows(labels: dict[str, float], kernels: dict[str, float]) -> list[tuple[str, float]]:
    """(category, ms per step) rows of one workload: the label trace's mean step (`labels`) split
    further by the stack trace's mean kernel times inside the model (`kernels`). The forward's
    Python glue is what the model label holds beyond those kernels. Kernels that add up to more
    than the model label (the two traces are two windows: load differs) are scaled down to fit it,
    leaving no glue; `kernel_fit` says by how much."""
    rows: list[tuple[str, float]] = []
    for title, key in SCHED_ROWS:
        if key is None:
            ms = labels.get("sched.recv", 0.0) + labels.get("sched.emit", 0.0)
        else:
            ms = labels.get(key, 0.0)
        rows.append((title, ms))
    model = labels.get("runner.model", 0.0)
    kernel_sum = sum(kernels.get(key, 0.0) for key in KERNEL_ROWS)
    fit = min(1.0, model / kernel_sum) if kernel_sum > 0 else 1.0  # never more kernel time than model time
    for key in KERNEL_ROWS:
        rows.append((f"forward: {key}", kernels.get(key, 0.0) * fit))
    rows.append(("forward: Python / torch glue (model label minus kernels)", model - kernel_sum * fit))
    return rows


def markdown_table(title: str, rows: list[tuple[str, float]], step_ms: float, extra: list[tuple]) -> str:
    """A table of `rows` (ms and % of `step_ms`) followed by `extra` (label, value text) lines."""
    out = [f"**{title}**", "", "| part | ms | % of step |", "|---|---:|---:|"]
    for name, ms in rows:
        out.append(
            f"| {name} | {ms:.2f} | {100 * ms / step_ms:.1f} |" if step_ms else f"| {name} | {ms:.2f} | |"
        )
    out.append(f"| **scheduler step (label trace, mean)** | **{step_ms:.2f}** | 100 |")
    for label, text in extra:
        out.append(f"| {label} | {text} | |")
    return "\n".join(out) + "\n"


def gemm_sum(kernels: dict[str, float]) -> float:
    return sum(kernels.get(k, 0.0) for k in LAYER_GEMMS + ("gemm lm_head",))


def layer_gemm_sum(kernels: dict[str, float]) -> float:
    return sum(kernels.get(k, 0.0) for k in LAYER_GEMMS)


def calibrate(kernels: dict[str, float], layer_gemms_label_ms: float) -> tuple[dict[str, float], float]:
    """The stack trace's kernel times scaled to the label trace's conditions: the layer GEMMs are
    seen by both (aten ops), so their ratio says how much slower or faster the stack trace's window
    ran (another job's load, the tracer's cache pollution). Returns (scaled kernels, ratio)."""
    stack = layer_gemm_sum(kernels)
    ratio = layer_gemms_label_ms / stack if stack > 0 and layer_gemms_label_ms > 0 else 1.0
    return {k: v * ratio for k, v in kernels.items() if k != "layer gemms"}, ratio


def kernel_fit(labels: dict[str, float], kernels: dict[str, float]) -> float:
    """The factor `breakdown_rows` scaled the kernel rows by (1.0: they fitted the model label)."""
    total = sum(kernels.get(key, 0.0) for key in KERNEL_ROWS)
    return min(1.0, labels.get("runner.model", 0.0) / total) if total > 0 else 1.0
