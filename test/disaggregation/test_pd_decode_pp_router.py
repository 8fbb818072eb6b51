"""A decode server with `--pp-size 2` behind `sglang-router` (SmolLM2-135M GGUF in float32, Mooncake
over TCP): each decode stage receives its own layers' KV from the prefill server, and greedy outputs
equal a colocated single-rank server's on ragged prompts sent at once (one longer than the prefill
chunk), streaming and not (test_pd_router_parity.py's test, run here on this layout); afterwards
both servers hold no KV and every request came through the transfer."""

from __future__ import annotations

import pytest

from pd_helpers import router_stack, wait_kv_restored
from test_pd_router_parity import COMMON, CHUNK, PROMPTS
from test_pd_router_parity import test_generate_parity_ragged_concurrent as test_decode_pp2_parity  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def servers():
    with router_stack(COMMON, CHUNK, decode_args=("--pp-size", "2"), prefix="pp-") as stack:
        yield stack


def test_decode_pp2_transfers_landed_and_kv_free(servers):
    state = servers["decode"].state()
    assert state["pd_landed"] >= 2 * len(PROMPTS) and state["pd_failed_transfers"] == 0, state
    for name in ("prefill", "decode"):
        wait_kv_restored(servers[name], timeout=30)
