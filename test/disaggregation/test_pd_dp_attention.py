"""The seeds' PD layout: a prefill server with `--cp-size 2` hands its KV to a decode server with
`--tp-size 2 --dp-size 2 --enable-dp-attention --ep-size 2` (tiny DeepSeek-V3.2 with MoE, dummy
float32 weights, Mooncake over TCP, short PD timeouts from pd_helpers).

Parity: each attention-DP replica is a decode endpoint: the DP controller sends a request to replica
`bootstrap_room % 2` (upstream's `follow_bootstrap_room`), and that replica's rank receives the MLA
latent rows and DSA index keys from the cp rank that stores each position. Greedy ids equal the
single-rank scheduler's, through `sglang-router` and with rooms of both parities (per-replica counts
asserted from /get_server_info); afterwards every replica's KV is free.

Failures (a second prefill server, chunks of 16): nothing leaks on any replica and nothing hangs.

* a client that leaves while its request waits for / receives its KV on replica 1: the decode
  aborts the room (its slots drain until the prefill ranks acknowledge), the prefill fails the
  room (at once if its half comes later, else mid-transfer) and answers with an abort; both
  servers get every KV slot back and the pair serves the next request;
* the decode server killed after its replica sent the KV addresses: the prefill's write fails,
  it frees the KV and answers with an abort within seconds; the router in front of the dead decode
  server answers with an error naming the decode side, not a hang (within the prefill's bootstrap
  timeout: the prefill half of a request whose decode half never started ends there).

One decode server serves the whole module (the layout's costliest start: two ranks and the DP
controller): the parity tests, then the client that leaves, then the test that kills it, last."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

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
from sglang.test.scheduler_harness import SchedulerHarness

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

NEW_TOKENS = 6
CHUNK = 64
# ragged, one longer than index_topk (8) and one longer than a page of the default size
PROMPTS = [list(range(5, 5 + 40)), [40, 41, 42], list(range(100, 121)), list(range(200, 213))]
COMMON = dummy_args(TINY_DSV32, 1024)
DECODE_DP = ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--ep-size", "2"]
PARAMS = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
# the failure tests': a prompt of 13 prefill chunks of 16
LONG_PROMPT = list(range(5, 5 + 200))
FAIL_PARAMS = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def decode():
    server = launch([*COMMON, *DECODE_DP], "dp-decode", mode="decode")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def servers(decode):
    started = []
    try:
        prefill = launch(
            [*COMMON, "--chunked-prefill-size", str(CHUNK), "--cp-size", "2"], "dp-prefill", "prefill"
        )
        started.append(prefill)
        router = launch_router(prefill, decode)
        started.append(router)
        yield {"prefill": prefill, "decode": decode, "router": router}
    finally:
        for p in reversed(started):
            p.stop()


@pytest.fixture(scope="module")
def small_chunk_prefill():
    server = launch([*COMMON, "--chunked-prefill-size", "16", "--cp-size", "2"], "dpf-prefill", "prefill")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    ref = SchedulerHarness(model_path=TINY_DSV32, load_format="dummy", dtype="float32", max_total_tokens=1024)
    rids = [ref.submit(p, NEW_TOKENS) for p in PROMPTS]
    ref.run()
    return [ref.outputs[r] for r in rids]


def _landed(decode) -> list[int]:
    return [s["pd_landed"] for s in decode.states()]


def test_rooms_pick_the_replica_and_tokens_match_single_rank(servers, reference):
    prefill, decode = servers["prefill"], servers["decode"]
    before = _landed(decode)
    assert len(before) == 2
    rooms = [1000 + i for i in range(len(PROMPTS))]  # even rooms -> replica 0, odd -> replica 1
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        outs = list(
            pool.map(
                lambda pr: post_pair(
                    prefill, decode, {"input_ids": pr[0], "sampling_params": PARAMS}, room=pr[1]
                ),
                zip(PROMPTS, rooms),
            )
        )
    assert [d.get("output_ids") for _, d in outs] == reference, outs
    after = _landed(decode)
    per_replica = [sum(1 for r in rooms if r % 2 == d) for d in range(2)]
    assert [a - b for a, b in zip(after, before)] == per_replica
    wait_kv_restored(prefill, 20)
    wait_kv_restored(decode, 20)


def test_through_router_matches_single_rank(servers, reference):
    decode = servers["decode"]
    before = _landed(decode)

    def generate(ids: list[int]) -> list[int]:
        r = httpx.post(
            servers["router"].url + "/generate",
            json={"input_ids": ids, "sampling_params": PARAMS},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        return r.json()["output_ids"]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(generate, PROMPTS))
    assert got == reference
    assert sum(_landed(decode)) - sum(before) == len(PROMPTS)
    wait_kv_restored(servers["prefill"], 20)
    wait_kv_restored(decode, 20)


def _room_body(prefill, room: int) -> dict:
    return {
        "input_ids": LONG_PROMPT,
        "sampling_params": FAIL_PARAMS,
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


def test_client_leaves_mid_transfer_on_replica_1(small_chunk_prefill, decode):
    prefill = small_chunk_prefill
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
            prefill, decode, {"input_ids": LONG_PROMPT[:30], "sampling_params": FAIL_PARAMS}, room=room
        )
        assert len(d_out["output_ids"]) == FAIL_PARAMS["max_new_tokens"], d_out
    assert [s["pd_landed"] - b for s, b in zip(decode.states(), before)] == [1, 1]
    wait_kv_restored(decode, 30)


def test_decode_killed_mid_transfer_router_answers(small_chunk_prefill, decode):
    """The module's last test: it kills the module's decode server."""
    prefill = small_chunk_prefill
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
            router.url + "/generate",
            json={"input_ids": LONG_PROMPT[:20], "sampling_params": FAIL_PARAMS},
            timeout=90,
        )
        assert r.status_code >= 500 and "decode" in r.text.lower(), (r.status_code, r.text)
        assert time.monotonic() - t0 < 45
        wait_kv_restored(prefill, 30)
    finally:
        if router is not None:
            router.stop()
