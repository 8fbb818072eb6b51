"""A DeepSeek-V3.2 (DSA) server with context parallelism: `launch_server --cp-size 2` on the tiny
dummy V3.2 config answers the openai client (/v1/completions) and the native API; its greedy ids on a prompt longer
than index_topk (sparse attention, chunked prefill, decodes over the sharded latent / index-key
cache) equal the in-process single-rank scheduler's, and it reports a sharded KV pool."""

from __future__ import annotations

import httpx
import openai
import pytest

from server_helpers import REPO, internal_state, launch_server
from sglang.srt.managers.tokenizer.incremental_detok import decode_ids
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.scheduler_harness import SchedulerHarness

pytestmark = pytest.mark.slow  # starts its own servers / engines

TINY_V32 = str(REPO / "python" / "sglang" / "test" / "assets" / "tiny-deepseek-v32")
NEW_TOKENS = 8
PROMPTS = [list(range(5, 5 + 37)), [40, 41, 42]]
ARGS = ("--max-total-tokens", "2048", "--chunked-prefill-size", "16")


@pytest.fixture(scope="module")
def dsa_cp2_server():
    handle = launch_server(("--model-path", TINY_V32, "--cp-size", "2", *ARGS))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    """Greedy ids of the in-process single-rank scheduler, per prompt (as a tuple)."""
    ref = SchedulerHarness(
        model_path=TINY_V32, load_format="dummy", max_total_tokens=2048, chunked_prefill_size=16
    )
    rids = [ref.submit(p, NEW_TOKENS) for p in PROMPTS]
    ref.run()
    return {tuple(p): ref.outputs[rid] for p, rid in zip(PROMPTS, rids)}


def test_dsa_cp2_openai_completion_equals_single_rank(dsa_cp2_server, reference):
    client = openai.OpenAI(base_url=dsa_cp2_server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    out = client.completions.create(
        model="default",
        prompt=PROMPTS[0],
        max_tokens=NEW_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == NEW_TOKENS
    tokenizer = get_tokenizer(TINY_V32)
    assert out.choices[0].text == decode_ids(tokenizer, reference[tuple(PROMPTS[0])], True, True)


def test_dsa_cp2_matches_single_rank_and_shards_kv(dsa_cp2_server, reference):
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    r = httpx.post(
        dsa_cp2_server.url + "/generate", json={"input_ids": PROMPTS, "sampling_params": params}, timeout=120
    )
    assert r.status_code == 200, r.text
    got = [item["output_ids"] for item in r.json()]
    assert got == [reference[tuple(p)] for p in PROMPTS]
    assert all(len(ids) == NEW_TOKENS for ids in got)
    with httpx.Client(base_url=dsa_cp2_server.url, timeout=60) as c:
        state = internal_state(c)
    assert state["cp_size"] == 2
    assert state["kv_physical_tokens_per_rank"] * 2 == state["max_total_num_tokens"] == 2048
