"""A server with attention DP: `--tp-size 2 --dp-size 2 --enable-dp-attention` answers the openai
client exactly as the single-rank server does (chat, completion, streaming, token ids); a stream
closed by the client mid-way is aborted on its replica; afterwards both replicas report their KV
pools back at their initial free counts and their requests gone (`/get_server_info`, one internal
state per replica; `/get_load` one entry per replica), and `/metrics` has a series per replica."""

from __future__ import annotations

import httpx
import pytest

from server_helpers import assert_full_answers, launch_server, openai_answers, wait_until

pytestmark = pytest.mark.slow  # starts its own servers / engines


@pytest.fixture(scope="module")
def dp2_server():
    handle = launch_server(("--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--enable-metrics"))
    yield handle
    handle.stop()


def _states(client: httpx.Client) -> list[dict]:
    r = client.get("/get_server_info")
    assert r.status_code == 200, r.text
    return r.json()["internal_states"]


def _idle_and_free(client: httpx.Client, initial: list[dict]) -> bool:
    states = _states(client)
    return all(
        s["num_running_reqs"] == 0
        and s["num_waiting_reqs"] == 0
        and s["available_kv_tokens"] == i["available_kv_tokens"]
        for s, i in zip(states, initial)
    )


def test_dp2_openai_answers_equal_single_rank(dp2_server, server):
    got = openai_answers(dp2_server)
    assert_full_answers(got)
    assert got == openai_answers(server)


def test_dp2_abort_mid_stream_frees_every_replica(dp2_server):
    import openai

    with dp2_server.client() as client:
        initial = _states(client)
        assert [s["dp_rank"] for s in initial] == [0, 1]
        oa = openai.OpenAI(base_url=dp2_server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        # two long streams, one per replica (round robin), both closed after a few chunks
        streams = [
            oa.completions.create(
                model="default",
                prompt="count with me:",
                max_tokens=2000,
                stream=True,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            for _ in range(2)
        ]
        for stream in streams:
            for i, _chunk in enumerate(stream):
                if i == 3:
                    break
        assert [s["num_running_reqs"] for s in _states(client)] == [1, 1]
        load = client.get("/get_load").json()  # what sglang-router's load policies read: one entry per rank
        assert [(e["dp_rank"], e["num_reqs"]) for e in load] == [(0, 1), (1, 1)]
        assert all(e["num_tokens"] > 0 for e in load)
        for stream in streams:
            stream.close()
        assert wait_until(lambda: _idle_and_free(client, initial), 30.0, 0.2), _states(client)
        metrics = client.get("/metrics").text
        assert 'sglang:num_running_reqs{dp_rank="1"' in metrics
        assert 'sglang:gen_throughput{dp_rank="1"' in metrics
