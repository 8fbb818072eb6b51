"""Table, plot and docs section of the vLLM comparison (from run.py's results dict)."""

from __future__ import annotations

import os
import re
from typing import Any, Optional

BEGIN = "<!-- vs_vllm:begin -->"
END = "<!-- vs_vllm:end -->"

# (workload, label, metric key, higher is better, goal ratio ours/vLLM or None)
ROWS = [
    ("a", "output tokens/s", "output_throughput", True, 1.0),
    ("a", "TTFT median, ms", "median_ttft_ms", False, None),
    ("a", "TTFT P99, ms", "p99_ttft_ms", False, None),
    ("a", "ITL median, ms", "median_itl_ms", False, None),
    ("b", "TTFT median, ms", "median_ttft_ms", False, 0.7),
    ("b", "TTFT P99, ms", "p99_ttft_ms", False, None),
    ("c", "output tokens/s", "output_throughput", True, None),
]


def _value(results: dict, engine: str, workload: str, key: str) -> Optional[float]:
    entry = results.get(engine, {}).get(workload)
    if not entry:
        return None
    return entry["median"].get(key)


def _fmt(x: Optional[float]) -> str:
    if x is None:
        return "—"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}"


def table(results: dict) -> str:
    names = results["workloads"]
    lines = [
        "| workload | metric | ours | vLLM-CPU 0.32 | ours / vLLM | goal | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for workload, label, key, higher, goal in ROWS:
        ours = _value(results, "ours", workload, key)
        peer = _value(results, "vllm", workload, key)
        ratio = ours / peer if ours is not None and peer else None
        goal_text, met = "", ""
        if goal is not None:
            goal_text = f"{'≥' if higher else '≤'} {goal:.1f}×"
            if ratio is not None:
                met = "yes" if (ratio >= goal if higher else ratio <= goal) else "no"
        ratio_text = f"{ratio:.2f}×" if ratio is not None else "—"
        lines.append(
            f"| ({workload}) {names[workload]} | {label} | {_fmt(ours)} | {_fmt(peer)} | {ratio_text} | {goal_text} | {met} |"
        )
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("a", "output_throughput", "(a) serving: output tokens/s"),
        ("b", "median_ttft_ms", "(b) 4K prompt: TTFT median, ms"),
        ("c", "output_throughput", "(c) offline: output tokens/s"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.6))
    for ax, (workload, key, title) in zip(axes, panels):
        values = [_value(results, "ours", workload, key) or 0.0, _value(results, "vllm", workload, key) or 0.0]
        bars = ax.bar(["ours", "vLLM-CPU"], values, color=["#3b7dd8", "#999999"])
        for bar, v in zip(bars, values):
            ax.annotate(_fmt(v) if v else "—", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom")
        ax.set_title(title, fontsize=10)
        ax.margins(y=0.15)
    fig.suptitle("SmolLM2-135M-Instruct bf16, same machine, same run", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(results: dict, plot_rel: str) -> str:
    meta = results["meta"]
    return "\n".join(
        [
            BEGIN,
            "## Side by side with vLLM-CPU 0.32 (benchmark/vs_vllm)",
            "",
            f"Command ({meta['date']}):",
            "",
            "```bash",
            meta["command"],
            "```",
            "",
            f"Machine: {meta['machine']}. Load average before the run: {meta['load_before']}. "
            f"Median of {meta['repeats']} runs per workload; the two servers ran one after the other, never together. "
            "Same model (SmolLM2-135M-Instruct GGUF converted to an HF directory, bf16), same prompts "
            "(seeded random tokens), greedy, `ignore_eos`, both driven by `python -m sglang.bench_serving "
            "--backend openai`. vLLM in its best configuration here (peers.md): "
            f"`{meta['vllm_config']}`. Ours: (a) `{meta['ours_args'] or 'defaults'}`, "
            f"(b) `{meta['ours_ttft_args'] or 'defaults'}`.",
            "",
            table(results),
            "",
            f"![ours vs vLLM-CPU]({plot_rel})",
            "",
            "Goals (issue 8): ≥ 1.0× vLLM's output throughput on (a); ≤ 0.7× its TTFT on (b).",
            END,
        ]
    )


def update_docs(docs_path: str, text: str) -> None:
    """Replace the marked section of `docs_path` (or append it)."""
    old = open(docs_path, encoding="utf-8").read() if os.path.exists(docs_path) else "# Benchmarks\n"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    new = pattern.sub(lambda _m: text, old) if pattern.search(old) else old.rstrip("\n") + "\n\n" + text + "\n"
    with open(docs_path, "w", encoding="utf-8") as f:
        f.write(new)


def write_report(results: dict, docs_path: str, plot_path: str) -> Any:
    plot(results, plot_path)
    rel = os.path.relpath(os.path.abspath(plot_path), os.path.dirname(os.path.abspath(docs_path)))
    update_docs(docs_path, section(results, rel))
    return table(results)
