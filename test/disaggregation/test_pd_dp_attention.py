"""The seeds' PD layout: a prefill server with `--cp-size 2` hands its KV to a decode server with
`--tp-size 2 --dp-size 2 --enable-dp-attention --ep-size 2` (tiny DeepSeek-V3.2 with MoE, dummy
float32 weights, Mooncake over TCP). Each attention-DP replica is a decode endpoint: the DP
controller sends a request to replica `bootstrap_room % 2` (upstream's `follow_bootstrap_room`),
and that replica's rank receives the MLA latent rows and DSA index keys from the cp rank that
stores each position. Greedy ids equal the single-rank scheduler's, through `sglang-router` and
with rooms of both parities (per-replica counts asserted from /get_server_info); afterwards every
replica's KV is free."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from pd_helpers import TINY_DSV32, dummy_args, launch, launch_router, post_pair, wait_kv_restored
from sglang.test.scheduler_harness import SchedulerHarness

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

NEW_TOKENS = 6
CHUNK = 64
# ragged, one longer than index_topk (8) and one longer than a page of the default size
PROMPTS = [list(range(5, 5 + 40)), [40, 41, 42], list(range(100, 121)), list(range(200, 213))]
COMMON = dummy_args(TINY_DSV32, 1024)
DECODE_DP = ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--ep-size", "2"]
PARAMS = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def servers():
    started = []
    try:
        prefill = launch(
            [*COMMON, "--chunked-prefill-size", str(CHUNK), "--cp-size", "2"], "dp-prefill", "prefill"
        )
        started.append(prefill)
        decode = launch([*COMMON, *DECODE_DP], "dp-decode", mode="decode")
        started.append(decode)
        router = launch_router(prefill, decode)
        started.append(router)
        yield {"prefill": prefill, "decode": decode, "router": router}
    finally:
        for p in reversed(started):
            p.stop()


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
