"""The scheduler-side metrics of `ServerMetrics` beyond running / queued requests and KV usage,
refreshed from `Scheduler.internal_state()` at scrape time (upstream's names):

| metric | type | state key |
|---|---|---|
| `sglang:gen_throughput` | gauge (dp_rank with attention DP) | `gen_throughput`: decode tokens / s over the last 40 decoding steps |
| `sglang:num_retracted_reqs` | gauge | `num_retractions`: requests retracted (KV full) since start |
| `sglang:queue_time_seconds` | histogram | `queue_time`: arrival to first step, cumulative bucket counts (summed over DP replicas) |
| `sglang:num_prefill_prealloc_queue_reqs` (alias `..._bootstrap_...`) | gauge | PD prefill: `pd_bootstrap_queue` |
| `sglang:num_prefill_inflight_queue_reqs` | gauge | PD prefill: `pd_inflight_queue` |
| `sglang:num_decode_prealloc_queue_reqs`, `sglang:num_decode_transfer_queue_reqs` | gauge | PD decode: `pd_prealloc_queue`, `pd_transfer_queue` |
| `sglang:kv_transfer_latency_ms`, `sglang:kv_transfer_speed_gb_s`, `sglang:kv_transfer_total_mb` | gauge | PD prefill: the latest KV transfer of `pd_recent_transfers` |

HiCache's counters: `hicache_metrics.py`. The PD figures come from the `Disaggregation`
component's own `internal_state()` (0 on a normal server).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import HistogramMetricFamily

from sglang.srt.metrics.hicache_metrics import HiCacheMetrics

PD_QUEUES = (
    (
        "sglang:num_prefill_prealloc_queue_reqs",
        "pd_bootstrap_queue",
        "Requests in the prefill prealloc (bootstrap) queue.",
    ),
    (
        "sglang:num_prefill_bootstrap_queue_reqs",
        "pd_bootstrap_queue",
        "Requests in the prefill bootstrap queue.",
    ),
    (
        "sglang:num_prefill_inflight_queue_reqs",
        "pd_inflight_queue",
        "Requests in the prefill inflight queue.",
    ),
    ("sglang:num_decode_prealloc_queue_reqs", "pd_prealloc_queue", "Requests in the decode prealloc queue."),
    ("sglang:num_decode_transfer_queue_reqs", "pd_transfer_queue", "Requests in the decode transfer queue."),
)


class QueueTimeHistogram:
    """`sglang:queue_time_seconds` from the schedulers' cumulative bucket counts (a custom
    collector: the counts are kept by the scheduler, this only renders the latest ones)."""

    name = "sglang:queue_time_seconds"

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.snapshots: list[dict] = []

    def update(self, snapshots: list[dict]) -> None:
        self.snapshots = [s for s in snapshots if s]

    def describe(self) -> list:
        return [
            HistogramMetricFamily(
                self.name, "Time a request waited in the queue, in seconds.", labels=["model_name"]
            )
        ]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            self.name, "Time a request waited in the queue, in seconds.", labels=["model_name"]
        )
        if self.snapshots:
            bounds = self.snapshots[0]["buckets"]
            counts = [sum(s["counts"][i] for s in self.snapshots) for i in range(len(bounds) + 1)]
            cumulative, running = [], 0
            for bound, count in zip([*map(float, bounds), float("inf")], counts):
                running += count
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
            family.add_metric([self.model_name], cumulative, sum(s["sum"] for s in self.snapshots))
        yield family


def latest_transfer(state: dict) -> Optional[tuple[float, float, float]]:
    """(latency ms, speed GB/s, MB) of the latest KV transfer with timing records, if any."""
    for transfer in reversed(state.get("pd_recent_transfers") or []):
        chunks = transfer.get("chunks") or []
        if not chunks:
            continue
        queued = min(c["queued"] for c in chunks)
        started = min(c["started"] for c in chunks)
        done = max(c["done"] for c in chunks)
        nbytes = float(transfer.get("bytes") or sum(c["nbytes"] for c in chunks))
        speed = nbytes / (done - started) / 1e9 if done > started else 0.0
        return (done - queued) * 1000.0, speed, nbytes / 1e6
    return None


class SchedulerMetrics:
    """Throughput, retractions, queue time, PD queues and KV transfer of one server's schedulers."""

    def __init__(self, model_name: str, registry: CollectorRegistry, dp_size: int = 1):
        self.model_name = model_name
        self.dp_size = max(1, dp_size)
        per_dp = ["model_name"] + (["dp_rank"] if self.dp_size > 1 else [])
        self.gen_throughput = Gauge(
            "sglang:gen_throughput", "Decode throughput in tokens per second.", per_dp, registry=registry
        )
        self.retracted = Gauge(
            "sglang:num_retracted_reqs",
            "Requests retracted (KV cache full) since start.",
            per_dp,
            registry=registry,
        )
        for d in range(self.dp_size):
            self.gen_throughput.labels(*self._labels(d)).set(0.0)
            self.retracted.labels(*self._labels(d)).set(0.0)
        self.queue_time = QueueTimeHistogram(model_name)
        registry.register(self.queue_time)
        self.hicache = HiCacheMetrics(model_name)
        registry.register(self.hicache)
        self.pd_queues = [
            (Gauge(name, doc, ["model_name"], registry=registry).labels(model_name), key)
            for name, key, doc in PD_QUEUES
        ]
        self.transfer = [
            Gauge(name, doc, ["model_name"], registry=registry).labels(model_name)
            for name, doc in (
                ("sglang:kv_transfer_latency_ms", "Latency of the latest KV transfer in milliseconds."),
                ("sglang:kv_transfer_speed_gb_s", "Speed of the latest KV transfer in GB/s."),
                ("sglang:kv_transfer_total_mb", "Size of the latest KV transfer in MB."),
            )
        ]
        for gauge, _ in self.pd_queues:
            gauge.set(0.0)
        for gauge in self.transfer:
            gauge.set(0.0)

    def _labels(self, dp_rank: int) -> tuple[str, ...]:
        return (self.model_name, str(dp_rank)) if self.dp_size > 1 else (self.model_name,)

    def update(self, state: dict, replica_states: Optional[list[dict]] = None) -> None:
        replicas = replica_states if self.dp_size > 1 and replica_states else [state]
        for d, s in enumerate(replicas[: self.dp_size]):
            _set(self.gen_throughput.labels(*self._labels(d)), s.get("gen_throughput"))
            _set(self.retracted.labels(*self._labels(d)), s.get("num_retractions"))
        self.queue_time.update([s.get("queue_time") for s in replicas])
        self.hicache.update(state)
        for gauge, key in self.pd_queues:
            _set(gauge, sum(s.get(key) or 0 for s in replicas))
        transfer = latest_transfer(state)
        if transfer is not None:
            for gauge, value in zip(self.transfer, transfer):
                gauge.set(value)


def _set(gauge: Any, value: Any) -> None:
    if isinstance(value, (int, float)):
        gauge.set(float(value))
