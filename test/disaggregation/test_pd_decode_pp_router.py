"""A decode server with `--pp-size 2` behind `sglang-router` (SmolLM2-135M GGUF in float32, Mooncake
over TCP): each decode stage receives its own layers' KV from the prefill server, and greedy outputs
equal a colocated single-rank server's on ragged prompts sent at once (one longer than the prefill
chunk), streaming and not; afterwards both servers hold no KV."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from pd_helpers import launch, launch_router, wait_kv_restored
from test_pd_router_parity import COMMON, GREEDY, PROMPTS, _generate

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CHUNK = 32


@pytest.fixture(scope="module")
def servers():
    started = []
    try:
        ref = launch(COMMON, "pp-colocated")
        started.append(ref)
        prefill = launch([*COMMON, "--chunked-prefill-size", str(CHUNK)], "pp-prefill", mode="prefill")
        started.append(prefill)
        decode = launch([*COMMON, "--pp-size", "2"], "pp-decode", mode="decode")
        started.append(decode)
        router = launch_router(prefill, decode)
        started.append(router)
        yield {"ref": ref, "prefill": prefill, "decode": decode, "router": router}
    finally:
        for p in reversed(started):
            p.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_decode_pp2_parity_ragged_concurrent(servers, stream):
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        ref = list(pool.map(lambda t: _generate(servers["ref"].url, t, stream), PROMPTS))
        got = list(pool.map(lambda t: _generate(servers["router"].url, t, stream), PROMPTS))
    assert all(len(r) == GREEDY["max_new_tokens"] for r in ref)
    assert got == ref
    state = servers["decode"].state()
    assert state["pd_landed"] >= len(PROMPTS) and state["pd_failed_transfers"] == 0
    for name in ("prefill", "decode"):
        wait_kv_restored(servers[name], timeout=30)
