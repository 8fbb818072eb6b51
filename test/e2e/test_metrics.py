"""`--enable-metrics`: /metrics parses with prometheus_client's parser, its counters and histograms
move when requests are served, and the scheduler gauges (running requests, KV usage) follow a live
request. Plus the metric objects on their own (no server)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang.srt.managers.scheduler.scheduler_output import due_for_output
from sglang.srt.metrics.bubble import BubbleMeter
from sglang.srt.metrics.collector import ServerMetrics
from server_helpers import API_KEY, ServerHandle, launch_server, wait_idle

pytestmark = pytest.mark.slow  # starts its own servers / engines

HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds")
COUNTERS = ("prompt_tokens", "generation_tokens", "cached_tokens", "num_requests", "num_aborted_requests")
GAUGES = (
    "num_running_reqs",
    "num_queue_reqs",
    "num_used_tokens",
    "token_usage",
    "cache_hit_rate",
    "pp_bubble_ratio",
)


def scrape(text: str) -> dict[str, float]:
    """`{sample name[{stage}]: value}`; parsing fails loudly on malformed exposition."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix("sglang:")
            if "le" in sample.labels:
                continue
            if "pp_stage" in sample.labels:
                name += f"[{sample.labels['pp_stage']}]"
            values[name] = sample.value
    return values


@pytest.fixture(scope="module")
def metrics_server() -> Iterator[ServerHandle]:
    handle = launch_server(("--enable-metrics",), api_key=API_KEY)
    yield handle
    handle.stop()


@pytest.fixture
def mclient(metrics_server: ServerHandle) -> Iterator[httpx.Client]:
    with metrics_server.client() as c:
        yield c


def get_metrics(client: httpx.Client) -> dict[str, float]:
    r = httpx.get(
        str(client.base_url.join("/metrics")), timeout=30
    )  # no API key: /metrics is open, like /health
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return scrape(r.text)


def test_metrics_exposition(mclient) -> None:
    values = get_metrics(mclient)
    for name in HISTOGRAMS:
        assert f"{name}_count" in values and f"{name}_sum" in values, name
    for name in COUNTERS:
        assert f"{name}_total" in values, name
    for name in GAUGES[:-1]:
        assert name in values, name
    assert values["pp_bubble_ratio[0]"] == 0.0  # PP off: stage 0 only, no bubble
    assert values["max_total_num_tokens"] == wait_idle(mclient)["max_total_num_tokens"] > 0


def test_counters_move_when_serving(mclient) -> None:
    wait_idle(mclient)
    before = get_metrics(mclient)
    params = {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0}
    r = mclient.post("/generate", json={"text": "metrics one two three", "sampling_params": params})
    assert r.status_code == 200, r.text
    prompt_a = r.json()["meta_info"]["prompt_tokens"]
    with mclient.stream(
        "POST", "/generate", json={"input_ids": [5, 6, 7, 8, 9], "sampling_params": params, "stream": True}
    ) as s:
        assert s.status_code == 200
        s.read()
    body = {
        "model": "default",
        "prompt": "metrics one two three",
        "max_tokens": 4,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with mclient.stream("POST", "/v1/completions", json=body) as s:
        assert s.status_code == 200
        usage = [
            json.loads(x[5:])["usage"] for x in s.iter_lines() if x.startswith("data: {") and '"usage"' in x
        ]
    assert usage[-1]["prompt_tokens_details"]["cached_tokens"] > 0  # same prompt again: radix hit
    after = get_metrics(mclient)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}

    assert delta["num_requests_total"] == 3
    assert delta["generation_tokens_total"] == 6 + 6 + 4
    assert delta["prompt_tokens_total"] == prompt_a + 5 + prompt_a
    assert delta["cached_tokens_total"] > 0 and after["cache_hit_rate"] > 0
    # TTFT / ITL: every request, streaming or not (the scheduler reports each first token at once).
    assert delta["time_to_first_token_seconds_count"] == 3
    assert delta["inter_token_latency_seconds_count"] == 5 + 5 + 3  # every token after the first
    assert delta["e2e_request_latency_seconds_count"] == 3
    assert delta["time_to_first_token_seconds_sum"] > 0
    assert delta["e2e_request_latency_seconds_sum"] >= delta["time_to_first_token_seconds_sum"]
    assert delta["num_aborted_requests_total"] == 0


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_non_streaming_request_observes_ttft_and_itl(mclient, route) -> None:
    wait_idle(mclient)
    before = get_metrics(mclient)
    tokens = 12
    if route == "/generate":
        body = {
            "text": "ttft without streaming",
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
        }
    else:
        body = {"model": "default", "max_tokens": tokens, "ignore_eos": True, "temperature": 0}
        body.update(
            {"prompt": "ttft without streaming"}
            if route == "/v1/completions"
            else {"messages": [{"role": "user", "content": "ttft without streaming"}]}
        )
    r = mclient.post(route, json=body)
    assert r.status_code == 200, r.text
    after = get_metrics(mclient)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert delta["num_requests_total"] == 1 and delta["generation_tokens_total"] == tokens
    assert delta["time_to_first_token_seconds_count"] == 1
    assert delta["inter_token_latency_seconds_count"] == tokens - 1
    # The first token is timed when it is produced, not when the whole answer arrives.
    assert 0 < delta["time_to_first_token_seconds_sum"] < delta["e2e_request_latency_seconds_sum"]
    assert delta["inter_token_latency_seconds_sum"] > 0


def test_scheduler_gauges_follow_a_live_request(mclient) -> None:
    wait_idle(mclient)
    body = {
        "input_ids": list(range(3, 40)),
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
        "stream": True,
    }
    with mclient.stream("POST", "/generate", json=body) as s:
        assert s.status_code == 200
        lines = s.iter_lines()  # keep the generator alive: closing it would close the stream
        for line in lines:
            if line.startswith("data:") and json.loads(line[5:]).get("output_ids"):
                break  # the request is decoding now
        live = get_metrics(mclient)
    assert live["num_running_reqs"] == 1 and live["num_queue_reqs"] == 0
    assert live["num_used_tokens"] >= 37
    assert live["token_usage"] == pytest.approx(live["num_used_tokens"] / live["max_total_num_tokens"])

    wait_idle(mclient)  # closing the stream aborted the request
    idle = get_metrics(mclient)
    assert idle["num_running_reqs"] == 0 and idle["num_used_tokens"] == 0
    assert idle["num_aborted_requests_total"] >= live["num_aborted_requests_total"] + 1


def test_no_metrics_route_without_the_flag(client) -> None:
    assert client.get("/metrics").status_code == 404


# ---------------------------------------------------------------------------- no server
def test_due_for_output_reports_every_first_token() -> None:
    def req(stream: bool, produced: int, sent: int, finished: bool = False) -> SimpleNamespace:
        return SimpleNamespace(
            stream=stream, output_ids=list(range(produced)), sent_len=sent, finished=finished
        )

    for stream in (False, True):
        assert not due_for_output(req(stream, 0, 0), 1)  # still prefilling
        assert due_for_output(req(stream, 1, 0), 4)  # first token: always, whatever the interval
        assert due_for_output(req(stream, 5, 5, finished=True), 4)
    assert not due_for_output(req(False, 9, 1), 1)  # non-streaming: the rest waits for the finish
    assert not due_for_output(req(True, 3, 1), 4) and due_for_output(req(True, 5, 1), 4)  # stream interval
    assert not due_for_output(req(True, 3, 3), 1)  # nothing new


def test_server_metrics_objects() -> None:
    m = ServerMetrics("m", pp_size=2)
    m.observe_ttft(0.2)
    m.observe_itl(0.3, 3)  # one message, three tokens: three gaps of 0.1
    m.observe_finish(prompt_tokens=40, completion_tokens=4, cached_tokens=10, e2e_s=0.5, aborted=False)
    m.observe_finish(prompt_tokens=60, completion_tokens=0, cached_tokens=40, e2e_s=0.1, aborted=True)
    m.update_scheduler_state(
        {
            "num_running_reqs": 3,
            "num_waiting_reqs": 2,
            "max_total_num_tokens": 1000,
            "available_kv_tokens": 750,
            "pp_bubble_ratio": [0.25, 0.5],
        }
    )
    v = scrape(m.render().decode())
    assert v["inter_token_latency_seconds_count"] == 3 and v[
        "inter_token_latency_seconds_sum"
    ] == pytest.approx(0.3)
    assert v["cache_hit_rate"] == pytest.approx(0.5) and v["num_aborted_requests_total"] == 1
    assert (v["num_running_reqs"], v["num_queue_reqs"], v["num_used_tokens"]) == (3, 2, 250)
    assert v["token_usage"] == pytest.approx(0.25)
    assert (v["pp_bubble_ratio[0]"], v["pp_bubble_ratio[1]"]) == (0.25, 0.5)
    m.update_scheduler_state({"pp_bubble_ratio": []})  # a stage that stops reporting goes back to 0
    assert scrape(m.render().decode())["pp_bubble_ratio[1]"] == 0.0


def test_bubble_meter_window() -> None:
    now = [0.0]
    meter = BubbleMeter(window_s=10.0, clock=lambda: now[0])
    assert meter.ratio() is None
    meter.busy(3.0)
    meter.idle(1.0)
    assert meter.ratio() == pytest.approx(0.25)
    now[0] = 5.0
    meter.idle(4.0)
    assert meter.ratio() == pytest.approx(5.0 / 8.0)
    now[0] = 12.0  # the first two events left the window
    assert meter.ratio() == pytest.approx(1.0)
    now[0] = 30.0
    assert meter.ratio() is None


def test_hicache_off_refuses_storage_clear_and_shows_no_hicache_series(mclient) -> None:
    """Without --enable-hierarchical-cache: /clear_hicache_storage_backend is a 400 naming why,
    and serving adds no `sglang:hicache_*` series to /metrics (test/hicache/test_hicache_server.py
    has the server with HiCache)."""
    r = mclient.post("/clear_hicache_storage_backend")
    assert r.status_code == 400 and "HiCache storage is off" in r.text, r.text
    ids = [10 + (i * 7) % 400 for i in range(160)]
    gen = mclient.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2}})
    assert gen.status_code == 200, gen.text
    wait_idle(mclient)
    assert not [k for k in get_metrics(mclient) if k.startswith("hicache_")]
