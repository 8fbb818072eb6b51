"""PD failures on the seeds' layout (prefill `--cp-size 2` -> decode `--tp-size 2 --dp-size 2
--enable-dp-attention --ep-size 2`, tiny DeepSeek-V3.2, dummy float32 weights, Mooncake over TCP,
short PD timeouts from pd_helpers): nothing leaks on any replica and nothing hangs.

* a client that leaves while its request waits for / receives its KV on replica 1: the decode
  aborts the room (its slots drain until the prefill ranks acknowledge), the prefill fails the
  room (at once if its half comes later, else mid-transfer) and answers with an abort; both
  servers get every KV slot back and the pair serves the next request;
* the decode server killed after its replica sent the KV addresses: the prefill's write fails,
  it frees the KV and answers with an abort within seconds; the router in front of the dead decode
  server answers with an error naming the decode side, not a hang (within the prefill's bootstrap
  timeout: the prefill half of a request whose decode half never started ends there)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from pd_helpers import (
    TINY_DSV32,
    dummy_args,
    launch,
    launch_router,
    post_async,
    post_pair,
    wait_kv_restored,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

COMMON = dummy_args(TINY_DSV32, 1024)
DECODE_DP = ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--ep-size", "2"]
PROMPT = list(range(5, 5 + 200))
PARAMS = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def prefill():
    server = launch([*COMMON, "--chunked-prefill-size", "16", "--cp-size", "2"], "dpf-prefill", "prefill")
    yield server
    server.stop()


def _room_body(prefill, room: int) -> dict:
    return {
        "input_ids": PROMPT,
        "sampling_params": PARAMS,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": room,
    }


def _replica_queue(decode, d: int) -> int:
    return decode.states()[d]["pd_transfer_queue"]


def _open_request(url: str, body: dict) -> socket.socket:
    """POST /generate over a raw connection; the caller leaves by closing it (a client that
    disconnects before any answer: the server notices on its next check and aborts)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def test_client_leaves_mid_transfer_on_replica_1(prefill):
    decode = launch([*COMMON, *DECODE_DP], "dpf-decode-a", mode="decode")
    try:
        for room, prefill_first in ((11, False), (13, True)):  # odd rooms: replica 1
            body = _room_body(prefill, room)
            out: dict = {}
            t_pre = None
            client = _open_request(decode.url, body)
            assert wait_until(lambda: _replica_queue(decode, 1) == 1, 30)
            assert _replica_queue(decode, 0) == 0
            if prefill_first:  # the prefill computes its 13 chunks while the client leaves
                t_pre = post_async(prefill.url, body, out, "prefill")
                wait_until(lambda: prefill.state()["num_running_reqs"] >= 1, 10, 0.05)
            client.close()  # the client leaves: the decode aborts the room
            if t_pre is None:
                assert wait_until(lambda: _replica_queue(decode, 1) == 0, 30)
                t_pre = post_async(prefill.url, body, out, "prefill")
            t_pre.join(60)
            status, result, elapsed = out["prefill"]
            assert status == 200 and elapsed < 30, out
            if not prefill_first:  # the decode side's failure was there first: refused at once
                reason = result["meta_info"]["finish_reason"]
                assert reason["type"] == "abort" and "PD transfer failed" in reason["message"], reason
            wait_kv_restored(prefill, 30)
            wait_kv_restored(decode, 30)
        # the pair still works, on both replicas
        before = [s["pd_landed"] for s in decode.states()]
        for room in (20, 21):
            _, d_out = post_pair(
                prefill, decode, {"input_ids": PROMPT[:30], "sampling_params": PARAMS}, room=room
            )
            assert len(d_out["output_ids"]) == PARAMS["max_new_tokens"], d_out
        assert [s["pd_landed"] - b for s, b in zip(decode.states(), before)] == [1, 1]
        wait_kv_restored(decode, 30)
    finally:
        decode.stop()


def test_decode_killed_mid_transfer_router_answers(prefill):
    decode = launch([*COMMON, *DECODE_DP], "dpf-decode-b", mode="decode")
    router = None
    try:
        router = launch_router(prefill, decode, ["--disable-retries"])
        wait_kv_restored(prefill, 30)
        body = _room_body(prefill, 7)  # replica 1
        out: dict = {}
        post_async(decode.url, body, out, "decode")
        assert wait_until(lambda: _replica_queue(decode, 1) == 1, 30)
        decode.kill()
        t_pre = post_async(prefill.url, body, out, "prefill")
        t_pre.join(60)
        status, result, elapsed = out["prefill"]
        reason = result["meta_info"]["finish_reason"]
        assert status == 200 and reason["type"] == "abort" and "PD transfer failed" in reason["message"], out
        assert elapsed < 30
        state = wait_kv_restored(prefill, 30)
        assert state["pd_failed_transfers"] >= 1
        # the router in front of the dead decode server: an error once the prefill half ends at its
        # bootstrap timeout (20 s here; the prefill cannot tell that the decode it never heard of is gone)
        t0 = time.monotonic()
        r = httpx.post(
            router.url + "/generate", json={"input_ids": PROMPT[:20], "sampling_params": PARAMS}, timeout=90
        )
        assert r.status_code >= 500 and "decode" in r.text.lower(), (r.status_code, r.text)
        assert time.monotonic() - t0 < 45
        wait_kv_restored(prefill, 30)
    finally:
        if router is not None:
            router.stop()
        decode.stop()
