"""A server with context parallelism: `--cp-size 2` alone (tp defaults to dp · cp = 2 ranks)
answers the openai client, matches a cp = 1 server's greedy ids on a long and a short prompt,
and reports its sharded KV pool."""

from __future__ import annotations

import httpx
import openai
import pytest

from server_helpers import internal_state, launch_server

GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
PROMPTS = [list(range(5, 5 + 37)), [40, 41, 42]]


def _generate(url: str) -> list[list[int]]:
    r = httpx.post(url + "/generate", json={"input_ids": PROMPTS, "sampling_params": GREEDY}, timeout=120)
    assert r.status_code == 200, r.text
    return [item["output_ids"] for item in r.json()]


@pytest.fixture(scope="module")
def cp2_server():
    handle = launch_server(("--cp-size", "2", "--max-total-tokens", "2048", "--chunked-prefill-size", "16"))
    yield handle
    handle.stop()


def test_cp2_serves_openai_client(cp2_server):
    client = openai.OpenAI(base_url=cp2_server.url + "/v1", api_key="none")
    chat = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi there"}], max_tokens=8, temperature=0
    )
    assert chat.usage.completion_tokens == 8 or chat.choices[0].finish_reason == "stop"
    pieces = list(client.completions.create(model="default", prompt="hello", max_tokens=6, stream=True, temperature=0))
    assert pieces and pieces[-1].choices[0].finish_reason in ("length", "stop")


def test_cp2_matches_cp1_and_reports_sharded_kv(cp2_server):
    got = _generate(cp2_server.url)
    with httpx.Client(base_url=cp2_server.url, timeout=60) as c:
        state = internal_state(c)
    assert state["cp_size"] == 2
    assert state["kv_physical_tokens_per_rank"] * 2 == state["max_total_num_tokens"] == 2048
    ref_server = launch_server(("--max-total-tokens", "2048", "--chunked-prefill-size", "16"))
    try:
        assert _generate(ref_server.url) == got
    finally:
        ref_server.stop()
