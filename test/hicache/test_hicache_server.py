"""HiCache through the real HTTP server (tiny Llama, dummy float32 weights): `/metrics` shows the
hits per tier, bytes loaded and load time after a workload that evicts a prefix from the KV pool
and reuses it (L2), and after a restart on the same file directory (L3);
`/clear_hicache_storage_backend` deletes this server's pages (another namespace's stay; at tp 2
both ranks' pages) so the next request finds nothing in storage. The 400 when HiCache is off is
checked on test/e2e/test_metrics.py's server (no server start of its own)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang.srt.mem_cache.hicache.file_storage import FileStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))  # server_helpers
from server_helpers import launch_server, wait_idle  # noqa: E402

pytestmark = pytest.mark.slow  # starts its own servers

POOL = 256  # KV pool tokens
PREFIX = [10 + (i * 7) % 400 for i in range(160)]
GREEDY = {"max_new_tokens": 2, "temperature": 0.0, "ignore_eos": True}


def hicache_server(directory: str, *extra: str, policy: str = "wait_complete"):
    return launch_server(
        (
            *extra,
            "--enable-metrics",
            *("--max-total-tokens", str(POOL), "--chunked-prefill-size", "64"),
            "--enable-hierarchical-cache",
            *("--hicache-storage-backend", "file"),
            *("--hicache-storage-prefetch-policy", policy),
            *("--hicache-storage-backend-extra-config", f'{{"file_path": "{directory}", "page_tokens": 16}}'),
        )
    )


def generate(client: httpx.Client, ids: list[int]) -> list[int]:
    r = client.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def hicache_metrics(client: httpx.Client) -> dict[str, float]:
    """`{sample name[label]: value}` of the `sglang:hicache_*` samples (parsed strictly)."""
    out = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for s in family.samples:
            if s.name.startswith("sglang:hicache_"):
                extra = s.labels.get("tier") or s.labels.get("op")
                out[s.name.removeprefix("sglang:") + (f"[{extra}]" if extra else "")] = s.value
    return out


def page_files(directory: str) -> list[str]:
    return [f for _, _, fs in os.walk(directory) for f in fs if f.endswith(".kv")]


def test_metrics_and_clear_storage_through_http(tmp_path):
    d = str(tmp_path / "kv")
    other = FileStorage(d, "another-model", 16)  # another server's pages in the same directory
    assert other.put("ab" * 32, b"keep")
    server = hicache_server(d)
    try:
        with server.client() as c:
            first = generate(c, PREFIX + [1])
            for k in range(2):  # fill the pool (not the host tier): PREFIX leaves L1 for L2
                generate(c, [500 + k] * 150)
            wait_idle(c)
            assert generate(c, PREFIX + [1]) == first
            wait_idle(c)
            m = hicache_metrics(c)
            assert m["hicache_hit_tokens_total[l2]"] >= 128, m
            assert m["hicache_hit_tokens_total[l3]"] == 0
            assert m["hicache_loaded_bytes_total"] > 0 and m["hicache_load_seconds_total"] > 0
            assert m["hicache_layer_load_seconds_total"] > 0  # the L2 -> L1 copies, on the loader
            assert m["hicache_backup_bytes_total"] >= m["hicache_loaded_bytes_total"]
            assert 0 < m["hicache_storage_write_seconds_total"] <= m["hicache_backup_seconds_total"]
            assert 0 < m["hicache_host_used_tokens"] <= m["hicache_host_capacity_tokens"]
            assert m["hicache_storage_pages_total[written]"] >= len(PREFIX) // 16
    finally:
        server.stop()
    written = len(page_files(d))
    assert written > 1
    restarted = hicache_server(d)
    try:
        with restarted.client() as c:
            assert generate(c, PREFIX + [1]) == first
            wait_idle(c)
            m = hicache_metrics(c)
            assert m["hicache_hit_tokens_total[l3]"] == len(PREFIX)  # 10 whole 16-token pages
            assert m["hicache_storage_pages_total[read]"] == len(PREFIX) // 16
            assert m["hicache_hit_tokens_total[l2]"] == 0 and m["hicache_loaded_bytes_total"] > 0
            for method in ("POST", "GET"):
                r = c.request(method, "/clear_hicache_storage_backend")
                assert r.status_code == 200 and "cleared" in r.text, r.text
            assert page_files(d) == ["ab" * 32 + ".kv"]  # only the other namespace's page is left
            assert other.get("ab" * 32) == b"keep"
            assert c.post("/flush_cache").status_code == 200  # L1 and L2 emptied too
            assert generate(c, PREFIX + [1]) == first  # recomputed: nothing left to load
            wait_idle(c)
            assert hicache_metrics(c)["hicache_hit_tokens_total[l3]"] == len(PREFIX)  # unchanged
    finally:
        restarted.stop()


def test_clear_storage_on_every_tp_rank(tmp_path):
    """tp 2: each rank writes its heads' pages under its own namespace folder; the route clears
    both (another server's folder stays)."""
    d = str(tmp_path / "kv")
    other = FileStorage(d, "another-model", 16)
    assert other.put("cd" * 32, b"keep")
    server = hicache_server(d, "--tp-size", "2")
    try:
        with server.client() as c:
            generate(c, PREFIX + [1])
            wait_idle(c)
            folders = sorted(os.listdir(d))
            assert len(folders) == 3 and os.path.basename(other.root) in folders
            assert len(page_files(d)) == 1 + 2 * (len(PREFIX) // 16)  # both ranks wrote their pages
            r = c.post("/clear_hicache_storage_backend")
            assert r.status_code == 200, r.text
            assert page_files(d) == ["cd" * 32 + ".kv"]
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stored_prefix(tmp_path_factory):
    """A directory holding PREFIX's pages (written by a best_effort server) and its tokens."""
    d = str(tmp_path_factory.mktemp("kv"))
    server = hicache_server(d, policy="best_effort")
    try:
        with server.client() as c:
            first = generate(c, PREFIX + [1])
            wait_idle(c)
    finally:
        server.stop()
    return d, first


@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
def test_prefetch_policies_through_http(stored_prefix, policy):
    """A restarted server reads the stored prefix in the background: the same tokens under every
    policy; wait_complete loads all 10 pages; the prefetch counters on /metrics add up."""
    d, first = stored_prefix
    server = hicache_server(d, policy=policy)
    try:
        with server.client() as c:
            assert generate(c, PREFIX + [1]) == first
            wait_idle(c)
            m = hicache_metrics(c)
            assert m["hicache_prefetch_hit_tokens_total"] == m["hicache_hit_tokens_total[l3]"]
            assert m["hicache_prefetch_pages_total"] * 16 >= m["hicache_hit_tokens_total[l3]"]
            assert m["hicache_prefetch_failures_total"] == 0
            if policy == "wait_complete":
                assert m["hicache_hit_tokens_total[l3]"] == len(PREFIX)
                assert m["hicache_prefetch_pages_total"] == len(PREFIX) // 16
    finally:
        server.stop()
