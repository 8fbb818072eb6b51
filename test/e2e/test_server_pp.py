"""A server with `--pp-size 2` (two pipeline stages, tiny Llama, dummy float32 weights) answers the
openai client, streaming included, and its greedy ids equal one in-process scheduler's; also with
`--dynamic-chunking-mode auto` (start-up profiling in both stage processes, 4-token chunks)."""

from __future__ import annotations

import httpx
import openai
import pytest

from server_helpers import TINY_LLAMA, launch_server, wait_idle
from sglang.test.pp_harness import req, run_single_rank

pytestmark = pytest.mark.slow  # starts its own servers / engines

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [40, 41, 42]]


@pytest.fixture(scope="module", params=["fixed", "auto"])
def pp2_server(request):
    extra = (
        () if request.param == "fixed" else ("--dynamic-chunking-mode", "auto", "--chunked-prefill-size", "4")
    )
    handle = launch_server(("--pp-size", "2", *extra))
    yield handle
    handle.stop()


def test_pp2_generate_matches_single_rank(pp2_server):
    r = httpx.post(
        pp2_server.url + "/generate", json={"input_ids": PROMPTS, "sampling_params": GREEDY}, timeout=60
    )
    assert r.status_code == 200, r.text
    got = [item["output_ids"] for item in r.json()]
    ref = run_single_rank(
        dict(
            model_path=TINY_LLAMA,
            load_format="dummy",
            dtype="float32",
            num_threads=1,
            skip_tokenizer_init=True,
        ),
        [[req(f"p{i}", p, GREEDY["max_new_tokens"]) for i, p in enumerate(PROMPTS)]],
    )["outputs"]
    assert got == [ref["p0"].output_ids, ref["p1"].output_ids]


def test_pp2_serves_openai_client(pp2_server):
    client = openai.OpenAI(base_url=pp2_server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    chat = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert chat.usage.completion_tokens == 8 and chat.choices[0].finish_reason == "length"
    whole = client.completions.create(
        model="default", prompt="hello", max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    pieces = list(
        client.completions.create(
            model="default",
            prompt="hello",
            max_tokens=6,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert len(pieces) >= 2 and pieces[-1].choices[0].finish_reason == "length"
    assert "".join(p.choices[0].text for p in pieces) == whole.choices[0].text
    with pp2_server.client() as c:
        state = wait_idle(c)
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
