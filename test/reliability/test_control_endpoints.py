"""Health and info endpoints answer within a second whatever the scheduler is doing:

- during a long prefill (one forward of several seconds: an 8192-token prompt, chunking off, on
  an 8-layer dummy Llama) `/health`, `/get_server_info`, `/server_info`, `/flush_cache` (refused
  at once: requests run), `/get_model_info`, `/v1/models` and `/metrics` all answer in < 1 s, and
  `/health_generate` is 200 (busy is not stuck);
- with the scheduler process frozen (SIGSTOP: really stuck) the same endpoints still answer in
  < 1 s and `/health_generate` is 503 after SGLANG_HEALTH_CHECK_TIMEOUT; after SIGCONT it is 200.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from mid_llama import make_mid_llama
from server_helpers import child_pids, launch_server, wait_until

pytestmark = pytest.mark.slow  # starts its own servers

LONG_PROMPT = 8192
FAST_S = 1.0
QUICK_ENDPOINTS = [
    ("GET", "/health"),
    ("GET", "/get_server_info"),
    ("GET", "/server_info"),
    ("POST", "/flush_cache"),
    ("GET", "/get_model_info"),
    ("GET", "/v1/models"),
    ("GET", "/metrics"),
]


@pytest.fixture(scope="module")
def mid_llama(tmp_path_factory) -> str:
    """A prefill of LONG_PROMPT tokens takes seconds on a CPU core (dummy weights)."""
    return make_mid_llama(tmp_path_factory.mktemp("models"))


def _timed(client: httpx.Client, method: str, path: str) -> tuple[float, httpx.Response]:
    start = time.monotonic()
    try:
        r = client.request(method, path, timeout=10)
    except httpx.TimeoutException:
        raise AssertionError(f"{method} {path} did not answer in 10 s") from None
    return time.monotonic() - start, r


def _scheduler_pid(server_pid: int) -> int:
    for pid in child_pids(server_pid):
        if open(f"/proc/{pid}/comm").read().strip() == "sglang-rank0":
            return pid
    raise AssertionError("no scheduler process")


def test_endpoints_answer_during_a_long_prefill(mid_llama):
    handle = launch_server(
        ("--chunked-prefill-size", "-1", "--max-total-tokens", "20000", "--enable-metrics"), model=mid_llama
    )
    try:
        with handle.client(timeout=120) as client:
            result: dict = {}

            def long_prefill() -> None:
                ids = [5 + (i * 7) % 500 for i in range(LONG_PROMPT)]
                result["r"] = client.post(
                    "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}
                )

            worker = threading.Thread(target=long_prefill)
            worker.start()

            def in_forward() -> bool:  # the scheduler is inside the prefill's forward
                state = client.get("/get_server_info").json()["internal_states"][0]
                return state["num_running_reqs"] == 1 and (state.get("step_running_s") or 0) > 0.3

            assert wait_until(in_forward, 60, 0.05), "the long prefill never showed up as a running step"
            timings = {}
            for method, path in QUICK_ENDPOINTS:
                elapsed, r = _timed(client, method, path)
                timings[path] = round(elapsed, 3)
                if path == "/flush_cache":
                    assert r.status_code == 400 and "running" in r.json()["error"]["message"], r.text
                else:
                    assert r.status_code == 200, (path, r.text)
            info = client.get("/get_server_info").json()["internal_states"][0]
            assert worker.is_alive(), (
                f"the prefill ended before the checks were done ({timings}): lengthen it"
            )
            assert all(t < FAST_S for t in timings.values()), timings
            assert info["num_running_reqs"] == 1 and info["step_running_s"] > 0
            assert client.get("/health_generate").status_code == 200  # busy, not stuck
            worker.join(120)
            assert (
                result["r"].status_code == 200 and result["r"].json()["meta_info"]["completion_tokens"] == 2
            )
            # afterwards the loop answers itself again: exact, fresh state
            assert wait_until(
                lambda: "step_running_s" not in client.get("/get_server_info").json()["internal_states"][0],
                10,
            )
            assert client.post("/flush_cache").status_code == 200
    finally:
        handle.stop()


def test_frozen_scheduler_fails_health_generate_but_not_the_info_endpoints():
    handle = launch_server(env={"SGLANG_HEALTH_CHECK_TIMEOUT": "2"})
    try:
        with handle.client(timeout=60) as client:
            assert client.get("/health_generate").status_code == 200
            time.sleep(1.0)  # heartbeats flowing (the first second of a server may have none yet)
            rank0 = _scheduler_pid(handle.proc.pid)
            os.kill(rank0, signal.SIGSTOP)
            try:
                time.sleep(2.0)  # a few heartbeats missed
                for method, path in QUICK_ENDPOINTS[:-1]:  # no metrics on this server
                    elapsed, r = _timed(client, method, path)
                    assert elapsed < FAST_S, (path, elapsed)
                    assert r.status_code == (400 if path == "/flush_cache" else 200), (path, r.text)
                start = time.monotonic()
                r = client.get("/health_generate")
                assert r.status_code == 503 and "unhealthy" in r.text, r.text
                assert time.monotonic() - start < 10
            finally:
                os.kill(rank0, signal.SIGCONT)
            assert wait_until(lambda: client.get("/health_generate").status_code == 200, 30, 0.5)
            r = client.post(
                "/generate", json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}}
            )
            assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 3
    finally:
        handle.stop()
