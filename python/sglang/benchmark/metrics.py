"""Serving metrics from per-request results, and SGLang's "Serving Benchmark Result" summary.

Definitions (SGLang's): TTFT = time to the first streamed output; ITL = gaps between successive
outputs; TPOT = (latency - TTFT) / (output_len - 1) per request with more than one output token;
E2E = request latency; concurrency = sum of E2E latencies / benchmark duration. Output tokens are
the server-reported counts when the backend gives them, else the re-tokenized text.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

import numpy as np

from sglang.benchmark.backends import RequestFuncOutput

WIDTH = 50


@dataclass
class Stats:
    mean: float = 0.0
    median: float = 0.0
    std: float = 0.0
    p90: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    max: float = 0.0

    @staticmethod
    def of_ms(values_s: list[float]) -> "Stats":
        if not values_s:
            return Stats()
        ms = np.asarray(values_s, dtype=np.float64) * 1000.0
        pct = np.percentile(ms, [50, 90, 95, 99])
        return Stats(
            float(ms.mean()),
            float(pct[0]),
            float(ms.std()),
            float(pct[1]),
            float(pct[2]),
            float(pct[3]),
            float(ms.max()),
        )


@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    duration: float
    total_input: int
    total_output: int
    total_output_retokenized: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    concurrency: float
    ttft: Stats
    itl: Stats
    tpot: Stats
    e2e: Stats


def calculate_metrics(
    outputs: list[RequestFuncOutput], duration: float, count_tokens: Callable[[str], int]
) -> tuple[BenchmarkMetrics, list[int]]:
    """Metrics of one run and the output length used for each request (0 for failures)."""
    ok = [o for o in outputs if o.success]
    retok = [count_tokens(o.generated_text) if o.success else 0 for o in outputs]
    out_lens = [(o.output_len or r) if o.success else 0 for o, r in zip(outputs, retok)]
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(out_lens)
    duration = max(duration, 1e-9)
    tpots = [(o.latency - o.ttft) / (n - 1) for o, n in zip(outputs, out_lens) if o.success and n > 1]
    metrics = BenchmarkMetrics(
        completed=len(ok),
        failed=len(outputs) - len(ok),
        duration=duration,
        total_input=total_in,
        total_output=total_out,
        total_output_retokenized=sum(retok),
        request_throughput=len(ok) / duration,
        input_throughput=total_in / duration,
        output_throughput=total_out / duration,
        total_throughput=(total_in + total_out) / duration,
        concurrency=sum(o.latency for o in ok) / duration,
        ttft=Stats.of_ms([o.ttft for o in ok]),
        itl=Stats.of_ms([gap for o in ok for gap in o.itl]),
        tpot=Stats.of_ms(tpots),
        e2e=Stats.of_ms([o.latency for o in ok]),
    )
    return metrics, out_lens


def _line(label: str, value: Any) -> str:
    if isinstance(value, float):
        return "{:<40} {:<10.2f}".format(label, value)
    return "{:<40} {:<10}".format(label, value)


def _section(title: str, fill: str = "-") -> str:
    return "{s:{c}^{n}}".format(s=title, n=WIDTH, c=fill)


def _stats_lines(name: str, stats: Stats, extra: tuple[str, ...] = ()) -> list[str]:
    lines = [
        _line(f"Mean {name} (ms):", stats.mean),
        _line(f"Median {name} (ms):", stats.median),
        _line(f"P90 {name} (ms):", stats.p90),
    ]
    if "p95" in extra:
        lines.append(_line(f"P95 {name} (ms):", stats.p95))
    lines.append(_line(f"P99 {name} (ms):", stats.p99))
    if "max" in extra:
        lines.append(_line(f"Max {name} (ms):", stats.max))
    return lines


def format_summary(
    m: BenchmarkMetrics, backend: str, request_rate: float, max_concurrency: Optional[int]
) -> str:
    """SGLang's "Serving Benchmark Result" block (with P90/P99 for every latency)."""
    lines = [
        _section(" Serving Benchmark Result ", "="),
        _line("Backend:", backend),
        _line("Traffic request rate:", "inf" if request_rate == float("inf") else request_rate),
        _line("Max request concurrency:", max_concurrency if max_concurrency else "not set"),
        _line("Successful requests:", m.completed),
        _line("Benchmark duration (s):", m.duration),
        _line("Total input tokens:", m.total_input),
        _line("Total generated tokens:", m.total_output),
        _line("Total generated tokens (retokenized):", m.total_output_retokenized),
        _line("Request throughput (req/s):", m.request_throughput),
        _line("Input token throughput (tok/s):", m.input_throughput),
        _line("Output token throughput (tok/s):", m.output_throughput),
        _line("Total token throughput (tok/s):", m.total_throughput),
        _line("Concurrency:", m.concurrency),
        _section("End-to-End Latency"),
        *_stats_lines("E2E Latency", m.e2e),
        _section("Time to First Token"),
        *_stats_lines("TTFT", m.ttft),
        _section("Time per Output Token (excl. 1st token)"),
        *_stats_lines("TPOT", m.tpot),
        _section("Inter-Token Latency"),
        *_stats_lines("ITL", m.itl, ("p95", "max")),
        "=" * WIDTH,
    ]
    if m.failed:
        lines.insert(5, _line("Failed requests:", m.failed))
    return "\n".join(lines)


def metrics_record(m: BenchmarkMetrics) -> dict:
    """Flat JSON fields (SGLang's names: mean_ttft_ms, p99_itl_ms, output_throughput, ...)."""
    record: dict[str, Any] = {
        "duration": m.duration,
        "completed": m.completed,
        "failed": m.failed,
        "total_input_tokens": m.total_input,
        "total_output_tokens": m.total_output,
        "total_output_tokens_retokenized": m.total_output_retokenized,
        "request_throughput": m.request_throughput,
        "input_throughput": m.input_throughput,
        "output_throughput": m.output_throughput,
        "total_throughput": m.total_throughput,
        "concurrency": m.concurrency,
    }
    for name, stats in (("e2e_latency", m.e2e), ("ttft", m.ttft), ("tpot", m.tpot), ("itl", m.itl)):
        for key, value in asdict(stats).items():
            record[f"{key}_{name}_ms"] = value
    return record
