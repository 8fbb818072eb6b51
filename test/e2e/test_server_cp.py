"""A server with context parallelism: `--cp-size 2` alone (tp defaults to dp · cp = 2 ranks)
answers the openai client and the native API exactly as a cp = 1 server with the same flags does
(greedy, a long and a short prompt, chunked prefill), and reports its sharded KV pool."""

from __future__ import annotations

import httpx
import pytest

from server_helpers import assert_full_answers, internal_state, launch_server, openai_answers

pytestmark = pytest.mark.slow  # starts its own servers / engines

GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
PROMPTS = [list(range(5, 5 + 37)), [40, 41, 42]]
ARGS = ("--max-total-tokens", "2048", "--chunked-prefill-size", "16")


def _generate(url: str) -> list[list[int]]:
    r = httpx.post(url + "/generate", json={"input_ids": PROMPTS, "sampling_params": GREEDY}, timeout=120)
    assert r.status_code == 200, r.text
    return [item["output_ids"] for item in r.json()]


@pytest.fixture(scope="module")
def cp2_server():
    handle = launch_server(("--cp-size", "2", *ARGS))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def cp1_server():
    handle = launch_server(ARGS)
    yield handle
    handle.stop()


def test_cp2_openai_answers_equal_cp1(cp2_server, cp1_server):
    got = openai_answers(cp2_server)
    assert_full_answers(got)
    assert got == openai_answers(cp1_server)


def test_cp2_matches_cp1_and_reports_sharded_kv(cp2_server, cp1_server):
    got = _generate(cp2_server.url)
    assert [len(ids) for ids in got] == [8, 8]
    assert got == _generate(cp1_server.url)
    with httpx.Client(base_url=cp2_server.url, timeout=60) as c:
        state = internal_state(c)
    assert state["cp_size"] == 2
    assert state["kv_physical_tokens_per_rank"] * 2 == state["max_total_num_tokens"] == 2048
