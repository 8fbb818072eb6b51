"""PD failures with a decode server of `--pp-size 2` (tiny Llama, dummy float32 weights, Mooncake
over TCP, short PD timeouts from pd_helpers): one decode pipeline rank (stage 1, `sglang-rank1`)
is SIGKILLed; the client gets an error, not a hang; the prefill server frees every KV slot and goes
on serving (a spare tp 1 decode server takes its next request); the router in front of the dead
decode server stays up and answers with an error.

* mid-transfer: stage 0 has allocated the room and sent its KV addresses, stage 1 asked for its
  layers, then stage 1 dies before the prefill runs: the decode server fails its pending request
  and exits, the prefill's write fails and it answers with an abort;
* mid-decode: the request has landed and is decoding (a long generation through the router) when
  stage 1 dies: the router's client gets an error within seconds.
Both errors are a 500 naming the dead rank."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

import pd_helpers as pd

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

COMMON = pd.dummy_args(pd.TINY_LLAMA, 4096)
PROMPT = list(range(5, 5 + 120))
PARAMS = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def prefill():
    server = pd.launch([*COMMON, "--chunked-prefill-size", "32"], "dppf-prefill", "prefill")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def spare(prefill):
    """A tp 1 decode server: the prefill goes on serving after a decode server died."""
    server = pd.launch(COMMON, "dppf-spare", "decode")
    yield server
    server.stop()


def _rank_pid(server, rank: int) -> int:
    """The pid of the server's scheduler process of `rank` (named sglang-rank{rank}, in the
    server's process group)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            pgid = os.getpgid(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
        if comm == f"sglang-rank{rank}" and pgid == server.proc.pid:
            return int(entry.name)
    raise AssertionError(f"no sglang-rank{rank} process in the server's group")


def _kill_stage1(decode) -> None:
    os.kill(_rank_pid(decode, 1), signal.SIGKILL)


def _room_body(prefill, room: int, params: dict = PARAMS) -> dict:
    return {
        "input_ids": PROMPT,
        "sampling_params": params,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": room,
    }


def _dead_rank_error(status, result) -> bool:
    """A 500 that names the dead pipeline rank (the decode server fails its pending requests with
    the watchdog's message before it exits), not a dropped connection or a timeout."""
    return status == 500 and "Scheduler rank 1" in str(result) and "SIGKILL" in str(result)


def _prefill_still_serves(prefill, spare) -> None:
    pd.wait_kv_restored(prefill, 30)
    _, d_out = pd.post_pair(prefill, spare, {"input_ids": PROMPT[:40], "sampling_params": PARAMS})
    assert len(d_out.get("output_ids", [])) == PARAMS["max_new_tokens"], d_out
    pd.wait_kv_restored(prefill, 30)
    pd.wait_kv_restored(spare, 30)


def _router_answers_error(router) -> None:
    """The router outlived its decode server and answers (an error naming the decode side) within
    the prefill's bootstrap timeout (20 s here), not a hang."""
    assert router.proc.poll() is None, router.log()
    t0 = time.monotonic()
    r = httpx.post(
        router.url + "/generate", json={"input_ids": PROMPT[:20], "sampling_params": PARAMS}, timeout=90
    )
    assert r.status_code >= 500 and "decode" in r.text.lower(), (r.status_code, r.text)
    assert time.monotonic() - t0 < 45


@contextlib.contextmanager
def _decode_pp2(prefill, name: str, pair_first: bool = False):
    """A decode server of --pp-size 2 (checked to serve a pair first when `pair_first`) and a
    router (no retries) in front of the pair; both stopped afterwards."""
    decode = pd.launch([*COMMON, "--pp-size", "2"], name, mode="decode")
    router = None
    try:
        if pair_first:
            _, d_out = pd.post_pair(prefill, decode, {"input_ids": PROMPT, "sampling_params": PARAMS})
            assert len(d_out["output_ids"]) == PARAMS["max_new_tokens"], d_out
        router = pd.launch_router(prefill, decode, ["--disable-retries"])
        pd.wait_kv_restored(prefill, 30)
        pd.wait_kv_restored(decode, 30)
        yield decode, router
    finally:
        if router is not None:
            router.stop()
        decode.stop()


def test_decode_stage1_killed_mid_transfer(prefill, spare):
    with _decode_pp2(prefill, "dppf-decode-a", pair_first=True) as (decode, router):
        body = _room_body(prefill, 1001)
        out: dict = {}
        t_dec = pd.post_async(decode.url, body, out, "decode")
        # stage 0 allocated the room's slots and sent its addresses; stage 1 asked for its layers
        assert pd.wait_until(lambda: decode.state()["pd_transfer_queue"] == 1, 30)
        _kill_stage1(decode)
        t_pre = pd.post_async(prefill.url, body, out, "prefill")
        t_dec.join(60)
        t_pre.join(60)
        assert not t_dec.is_alive() and not t_pre.is_alive()
        status, result, elapsed = out["decode"]
        assert _dead_rank_error(status, result) and elapsed < 40, out
        status, result, elapsed = out["prefill"]
        reason = result["meta_info"]["finish_reason"]
        assert status == 200 and reason["type"] == "abort" and "PD transfer failed" in reason["message"], out
        assert elapsed < 40
        assert pd.wait_until(lambda: decode.proc.poll() is not None, 30), "the decode server did not exit"
        state = pd.wait_kv_restored(prefill, 30)
        assert state["pd_failed_transfers"] >= 1
        _router_answers_error(router)
        _prefill_still_serves(prefill, spare)


def test_decode_stage1_killed_mid_decode(prefill, spare):
    with _decode_pp2(prefill, "dppf-decode-b") as (decode, router):
        landed = decode.state()["pd_landed"]
        out: dict = {}
        long = {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True}
        t_cli = pd.post_async(router.url, {"input_ids": PROMPT, "sampling_params": long}, out, "client")

        def decoding() -> bool:
            s = decode.state()
            return s["pd_landed"] > landed and s["num_running_reqs"] >= 1

        assert pd.wait_until(decoding, 60, 0.1), decode.state()
        _kill_stage1(decode)
        t0 = time.monotonic()
        t_cli.join(60)
        assert not t_cli.is_alive(), "the client's request hangs"
        status, result, _ = out["client"]
        assert _dead_rank_error(status, result), out  # the router passes the decode's error on
        assert time.monotonic() - t0 < 30, out
        assert pd.wait_until(lambda: decode.proc.poll() is not None, 30), "the decode server did not exit"
        _router_answers_error(router)
        _prefill_still_serves(prefill, spare)
