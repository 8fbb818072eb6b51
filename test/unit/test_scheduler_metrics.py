"""The scheduler-side metrics on their own (no server): decode throughput, the queue-time histogram,
the PD queue and KV-transfer gauges from a prefill / decode server's state, attention-DP sums; the
scheduler's profiler (a trace per rank, auto-stop after num_steps); /start_profile's body and
/get_load's entries."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang.srt.entrypoints.http.admin import load_entry, profile_request
from sglang.srt.entrypoints.openai.utils import OpenAIError
from sglang.srt.managers.io_struct import ProfileReqInput
from sglang.srt.managers.scheduler.profiler import SchedulerProfiler
from sglang.srt.metrics.collector import ServerMetrics
from sglang.srt.metrics.scheduler_stats import BucketCounts, DecodeThroughput


def samples(metrics: ServerMetrics) -> dict:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            key = s.name + "".join(f"[{k}={v}]" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[key] = s.value
    return out


def test_decode_throughput_counts_decode_steps_only() -> None:
    meter = DecodeThroughput(window=3)
    assert meter.value == 0.0
    for t in range(5):  # 5 steps of 0.5 s, 4 tokens each
        meter.launch(t * 1.0)
        meter.finish(t * 1.0 + 0.5, 4)
    meter.launch(10.0)
    meter.finish(20.0, 0)  # a prefill-only step does not count
    assert meter.value == pytest.approx(8.0)


def test_bucket_counts_and_histogram_rendering() -> None:
    counts = BucketCounts((0.1, 1.0))
    for v in (0.05, 0.5, 0.7, 5.0):
        counts.observe(v)
    assert counts.snapshot()["counts"] == [1, 2, 1] and counts.count == 4
    m = ServerMetrics("m")
    m.update_scheduler_state({"queue_time": counts.snapshot(), "gen_throughput": 3.5, "num_retractions": 2})
    got = samples(m)
    assert got["sglang:queue_time_seconds_bucket[le=0.1]"] == 1
    assert got["sglang:queue_time_seconds_bucket[le=1.0]"] == 3
    assert got["sglang:queue_time_seconds_bucket[le=+Inf]"] == 4
    assert got["sglang:queue_time_seconds_count"] == 4 and got[
        "sglang:queue_time_seconds_sum"
    ] == pytest.approx(6.25)
    assert got["sglang:gen_throughput"] == 3.5 and got["sglang:num_retracted_reqs"] == 2


def test_pd_queue_and_transfer_gauges() -> None:
    m = ServerMetrics("m")
    chunk = {"tokens": 8, "nbytes": 2_000_000, "queued": 10.0, "started": 10.01, "done": 10.011}
    prefill = {
        "pd_bootstrap_queue": 2,
        "pd_inflight_queue": 3,
        "pd_recent_transfers": [{"room": 5, "bytes": 2_000_000, "chunks": [chunk]}],
    }
    m.update_scheduler_state(prefill)
    got = samples(m)
    assert got["sglang:num_prefill_prealloc_queue_reqs"] == 2
    assert got["sglang:num_prefill_inflight_queue_reqs"] == 3
    assert got["sglang:kv_transfer_latency_ms"] == pytest.approx(11.0)
    assert got["sglang:kv_transfer_speed_gb_s"] == pytest.approx(2.0)
    assert got["sglang:kv_transfer_total_mb"] == pytest.approx(2.0)
    m.update_scheduler_state({"pd_prealloc_queue": 4, "pd_transfer_queue": 1})
    got = samples(m)
    assert (
        got["sglang:num_decode_prealloc_queue_reqs"] == 4
        and got["sglang:num_decode_transfer_queue_reqs"] == 1
    )
    assert got["sglang:num_prefill_inflight_queue_reqs"] == 0


def test_dp_replicas_have_their_own_throughput_and_a_summed_queue_time() -> None:
    m = ServerMetrics("m", dp_size=2)
    a, b = BucketCounts(), BucketCounts()
    a.observe(0.01)
    b.observe(0.02)
    b.observe(0.03)
    replicas = [
        {"gen_throughput": 5.0, "queue_time": a.snapshot(), "pd_transfer_queue": 1},
        {"gen_throughput": 7.0, "queue_time": b.snapshot(), "pd_transfer_queue": 2},
    ]
    m.update_scheduler_state({}, replicas)
    got = samples(m)
    assert got["sglang:gen_throughput[dp_rank=0]"] == 5.0 and got["sglang:gen_throughput[dp_rank=1]"] == 7.0
    assert got["sglang:queue_time_seconds_count"] == 3
    assert got["sglang:num_decode_transfer_queue_reqs"] == 3


def test_profiler_writes_a_trace_and_stops_after_num_steps(tmp_path) -> None:
    prof = SchedulerProfiler(world_rank=3)
    out = prof.handle(ProfileReqInput("start", output_dir=str(tmp_path / "t"), num_steps=2, profile_id="p"))
    assert out.success and prof.active
    assert not prof.handle(ProfileReqInput("start", output_dir=str(tmp_path))).success  # already running
    sum(i * i for i in range(1000))
    prof.on_step()
    assert prof.active
    prof.on_step()
    assert not prof.active
    trace = tmp_path / "t" / "p-rank3.trace.json"
    assert "traceEvents" in json.loads(trace.read_text())
    assert not prof.handle(ProfileReqInput("stop")).success
    refused = prof.handle(ProfileReqInput("start", output_dir=str(tmp_path), activities=("TPU",)))
    assert not refused.success and "TPU" in refused.message


def test_start_profile_body(monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_TORCH_PROFILER_DIR", "/somewhere")
    msg = profile_request({})
    assert msg.action == "start" and msg.output_dir == "/somewhere" and msg.activities == ("CPU",)
    assert profile_request({"output_dir": "/x", "num_steps": 3}).num_steps == 3
    for body in ({"start_step": 2}, {"num_steps": 0}, {"activities": "CPU"}):
        with pytest.raises(OpenAIError):
            profile_request(body)


def test_load_entry() -> None:
    state = {"dp_rank": 1, "num_running_reqs": 2, "num_waiting_reqs": 3, "max_total_num_tokens": 100}
    state["available_kv_tokens"] = 60
    assert load_entry(state, 0) == {"dp_rank": 1, "num_reqs": 5, "num_waiting_reqs": 3, "num_tokens": 40}
