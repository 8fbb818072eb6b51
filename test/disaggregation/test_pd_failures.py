"""PD failures lose nothing and leak nothing (tiny Llama, dummy float32 weights, Mooncake over TCP;
requests sent the way sglang-router sends them: the same room to both servers):

* decode server killed after its handshake, while the prefill computes / transfers: the prefill
  fails the transfer, frees the KV and answers with an abort, within seconds;
* prefill server killed while the decode waits for its KV: the decode fails the request after the
  heartbeat (interval 1 s x 2 here) with a clear error and frees the pre-allocated KV;
* a request whose prefill half never arrives fails on both servers after the bootstrap / waiting
  timeouts (20 s here), and the KV is freed.
Afterwards the surviving server reports its initial KV free count.

A server that survives one test serves the next (`ServerPool`; a test that fails hands the next a
fresh one): the prefill server of the first test is the one killed in the second, and the decode
server of the timeout test is the one that rejects requests without bootstrap fields (5 server
starts instead of 7)."""

from __future__ import annotations

import random
import time

import httpx
import pytest

from pd_helpers import TINY_LLAMA, ServerPool, launch, post_async, post_pair, wait_kv_restored, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ARGS = ["--model-path", TINY_LLAMA, "--load-format", "dummy", "--dtype", "float32", "--num-threads", "1"]
PROMPT = list(range(5, 5 + 300))
BODY = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
SHORT_WAIT = {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "4"}


@pytest.fixture(scope="module")
def pool():
    servers = ServerPool({"prefill": 2, "short-wait-decode": 2})
    yield servers
    servers.close()


def _room_body(prefill) -> dict:
    return {
        **BODY,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": random.getrandbits(63),
    }


def test_pair_works_then_decode_killed_mid_transfer(pool):
    prefill = pool.get("prefill", ARGS, "f-prefill", "prefill")
    decode = None
    ok = False
    try:
        decode = launch(ARGS, "f-decode", mode="decode")
        p_out, d_out = post_pair(prefill, decode, BODY)  # the pair works
        assert len(d_out["output_ids"]) == 8, d_out
        wait_kv_restored(prefill, 20)
        wait_kv_restored(decode, 20)

        body = _room_body(prefill)
        out: dict = {}
        t_dec = post_async(decode.url, body, out, "decode")
        # the decode side has allocated and sent its KV addresses: kill it before the prefill runs
        assert wait_until(lambda: decode.state()["pd_transfer_queue"] == 1, 30)
        decode.kill()
        t0 = time.monotonic()
        t_pre = post_async(prefill.url, body, out, "prefill")
        t_pre.join(60)
        t_dec.join(5)
        status, result, _ = out["prefill"]
        assert status == 200 and result["meta_info"]["finish_reason"]["type"] == "abort", result
        assert "PD transfer failed" in result["meta_info"]["finish_reason"]["message"]
        assert time.monotonic() - t0 < 30  # bounded (the failed write is detected at once)
        state = wait_kv_restored(prefill, 20)
        assert state["pd_failed_transfers"] >= 1
        ok = True
    finally:
        pool.release("prefill", broken=not ok)  # the next test kills it
        if decode is not None:
            decode.stop()


def test_prefill_killed_while_decode_waits(pool):
    prefill = pool.get("prefill", ARGS, "g-prefill", "prefill")
    decode = None
    try:
        decode = launch(ARGS, "g-decode", mode="decode")
        initial = decode.state()["available_kv_tokens"]
        body = _room_body(prefill)
        out: dict = {}
        t_dec = post_async(decode.url, body, out, "decode")  # its prefill half is never sent
        assert wait_until(lambda: decode.state()["pd_transfer_queue"] == 1, 30)
        assert decode.state()["available_kv_tokens"] < initial  # pre-allocated
        prefill.kill()
        t_dec.join(60)
        status, result, elapsed = out["decode"]
        assert status == 200, result
        reason = result["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "unreachable" in reason["message"], reason
        assert elapsed < 20  # heartbeat 1 s x 2, not the 60 s waiting timeout (pd_helpers.PD_ENV)
        wait_kv_restored(decode, 20)
        # a new request for the dead prefill server fails fast too, and leaks nothing
        t_dec = post_async(decode.url, _room_body(prefill), out, "again")
        t_dec.join(60)
        assert out["again"][1]["meta_info"]["finish_reason"]["type"] == "abort"
        wait_kv_restored(decode, 20)
    finally:
        pool.release("prefill", broken=True)  # killed above
        if decode is not None:
            decode.stop()


def test_missing_half_times_out_on_both_sides(pool):
    prefill = launch(ARGS, "h-prefill", mode="prefill", env={"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "4"})
    ok = False
    try:
        decode = pool.get("short-wait-decode", ARGS, "h-decode", "decode", env=SHORT_WAIT)
        out: dict = {}
        # prefill half only: no decode ever sends KV addresses -> bootstrap timeout on the prefill
        t1 = post_async(prefill.url, _room_body(prefill), out, "prefill")
        # decode half only: the prefill never computes it -> waiting timeout on the decode
        t2 = post_async(decode.url, _room_body(prefill), out, "decode")
        t1.join(60)
        t2.join(60)
        for key, word in (("prefill", "BOOTSTRAP_TIMEOUT"), ("decode", "WAITING_TIMEOUT")):
            status, result, elapsed = out[key]
            reason = result["meta_info"]["finish_reason"]
            assert status == 200 and reason["type"] == "abort" and word in reason["message"], (key, result)
            assert elapsed < 20
        wait_kv_restored(prefill, 20)
        wait_kv_restored(decode, 20)
        ok = True
    finally:
        prefill.stop()
        pool.release("short-wait-decode", broken=not ok)  # the next test's


def test_requests_without_bootstrap_fields_are_rejected(pool):
    decode = pool.get("short-wait-decode", ARGS, "i-decode", "decode", env=SHORT_WAIT)
    try:
        r = httpx.post(decode.url + "/generate", json=BODY, timeout=30)
        assert r.status_code == 400 and "bootstrap_room" in r.text
        r = httpx.post(
            decode.url + "/generate", json={**BODY, "bootstrap_host": "127.0.0.1", "bootstrap_room": "x"}
        )
        assert r.status_code == 400
    finally:
        pool.release("short-wait-decode")
