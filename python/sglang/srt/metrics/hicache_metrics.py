"""HiCache's counters on `/metrics`, rendered from the `hicache_*` keys of the scheduler's internal
state (the entry rank's, `mem_cache/hicache/`) at scrape time; nothing is rendered while HiCache
is off. Cumulative since start:

| metric | type | state key |
|---|---|---|
| `sglang:hicache_hit_tokens_total{tier}` | counter | `hicache_l1_hit_tokens` (`tier="l1"`: admitted prefix tokens already in the KV pool), `hicache_l2_hit_tokens` (`"l2"`: loaded from the host tier), `hicache_l3_hit_tokens` (`"l3"`: loaded from storage) |
| `sglang:hicache_loaded_bytes_total` | counter | `hicache_loaded_bytes`: KV bytes loaded from L2 and L3 |
| `sglang:hicache_load_seconds_total` | counter | `hicache_load_seconds`: time admission spent loading |
| `sglang:hicache_layer_load_seconds_total` | counter | `hicache_layer_load_seconds`: time the layer loader spent copying host rows into the KV pool, beside the forward |
| `sglang:hicache_backup_bytes_total` | counter | `hicache_backup_bytes`: KV bytes copied to the host tier |
| `sglang:hicache_backup_seconds_total`, `_storage_write_seconds_total` | counter | `hicache_backup_seconds`: time the scheduler spent copying to the host tier, storage writes included; `hicache_storage_write_seconds`: of it, writing storage pages |
| `sglang:hicache_prefetch_pages_total`, `_prefetch_hit_tokens_total`, `_prefetch_wait_seconds_total`, `_prefetch_failures_total` | counter | `hicache_prefetch_pages`, `_prefetch_hit_tokens`, `_prefetch_wait_seconds`, `_prefetch_failures` (storage prefetch; at pp > 1 stage 0's) |
| `sglang:hicache_storage_pages_total{op}` | counter | `hicache_storage_pages_read`, `_pages_written`, `_read_failures`, `_write_failures` |
| `sglang:hicache_host_used_tokens`, `sglang:hicache_host_capacity_tokens` | gauge | `hicache_host_tokens`, `hicache_host_capacity` |
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

TIERS = ("l1", "l2", "l3")
STORAGE_OPS = (
    ("read", "hicache_storage_pages_read"),
    ("written", "hicache_storage_pages_written"),
    ("read_failure", "hicache_storage_read_failures"),
    ("write_failure", "hicache_storage_write_failures"),
)
COUNTERS = (
    (
        "sglang:hicache_loaded_bytes",
        "KV bytes loaded from the host tier and storage.",
        "hicache_loaded_bytes",
    ),
    (
        "sglang:hicache_load_seconds",
        "Seconds spent loading KV from the host tier and storage.",
        "hicache_load_seconds",
    ),
    (
        "sglang:hicache_layer_load_seconds",
        "Seconds the layer loader spent copying KV from the host tier into the KV pool.",
        "hicache_layer_load_seconds",
    ),
    (
        "sglang:hicache_backup_bytes",
        "KV bytes copied from the KV pool to the host tier.",
        "hicache_backup_bytes",
    ),
    (
        "sglang:hicache_backup_seconds",
        "Seconds the scheduler spent copying KV to the host tier (storage writes included).",
        "hicache_backup_seconds",
    ),
    (
        "sglang:hicache_storage_write_seconds",
        "Seconds the scheduler spent writing storage pages.",
        "hicache_storage_write_seconds",
    ),
    (
        "sglang:hicache_prefetch_pages",
        "Storage pages prefetched into the host tier.",
        "hicache_prefetch_pages",
    ),
    (
        "sglang:hicache_prefetch_hit_tokens",
        "Admitted prefix tokens that came from a storage prefetch.",
        "hicache_prefetch_hit_tokens",
    ),
    (
        "sglang:hicache_prefetch_wait_seconds",
        "Seconds waiting requests were held back for their storage prefetch.",
        "hicache_prefetch_wait_seconds",
    ),
    (
        "sglang:hicache_prefetch_failures",
        "Storage prefetches cut short by a bad page or an unreachable backend (recomputed).",
        "hicache_prefetch_failures",
    ),
)
GAUGES = (
    ("sglang:hicache_host_used_tokens", "Tokens held in the host tier.", "hicache_host_tokens"),
    ("sglang:hicache_host_capacity_tokens", "Tokens the host tier can hold.", "hicache_host_capacity"),
)


class HiCacheMetrics:
    """A custom collector: the scheduler keeps the counts, this renders the latest ones."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.state: dict = {}

    def update(self, state: dict) -> None:
        hicache = {k: v for k, v in state.items() if k.startswith("hicache_")}
        if hicache:  # a heartbeat's snapshot without them keeps the previous values
            self.state = hicache

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        s = self.state
        if not s:
            return
        labels = ["model_name"]
        hits = CounterMetricFamily(
            "sglang:hicache_hit_tokens", "Admitted prefix tokens per cache tier.", labels=labels + ["tier"]
        )
        for tier in TIERS:
            hits.add_metric([self.model_name, tier], float(s.get(f"hicache_{tier}_hit_tokens", 0)))
        yield hits
        for name, doc, key in COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric([self.model_name], float(s.get(key, 0)))
            yield counter
        if "hicache_storage_pages_read" in s:
            pages = CounterMetricFamily(
                "sglang:hicache_storage_pages", "Storage (L3) page operations.", labels=labels + ["op"]
            )
            for op, key in STORAGE_OPS:
                pages.add_metric([self.model_name, op], float(s.get(key, 0)))
            yield pages
        for name, doc, key in GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric([self.model_name], float(s.get(key, 0)))
            yield gauge
