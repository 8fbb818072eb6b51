"""Requests that cannot fit, and more requests than the server queues:

- a prompt longer than the context, `max_new_tokens` past the context, and more KV than the
  pool (a prompt, or prompt + max_new_tokens) get a 400 whose message names the limit, on
  `/generate` and both OpenAI routes (the openai client raises BadRequestError), and the server
  keeps serving;
- past `--max-queued-requests` (upstream's flag) a request is refused with a 503 and a message
  naming the flag, streaming or not, never by running out of memory; everything accepted
  completes and the server ends idle with its KV pool and request table whole.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from server_helpers import internal_state, launch_server, wait_idle

pytestmark = pytest.mark.slow  # starts its own servers

CONTEXT = 512
POOL = 300


@pytest.fixture(scope="module")
def small_server():
    handle = launch_server(("--context-length", str(CONTEXT), "--max-total-tokens", str(POOL)))
    yield handle
    handle.stop()


def _cases(pool: int) -> list[tuple[list[int], int, str]]:
    """(prompt ids, max_new_tokens, the words the 400 must contain)."""
    return [
        ([7] * (CONTEXT + 10), 4, f"maximum input length of {CONTEXT - 1} tokens (context length {CONTEXT})"),
        ([7] * 100, CONTEXT - 50, f"maximum context length is {CONTEXT} tokens"),
        ([7] * (pool + 20), 4, f"KV cache pool can hold for one request: {pool} tokens"),
        ([7] * (pool // 2 + 10), pool // 2, f"more than the KV cache pool's {pool} tokens"),
    ]


def test_requests_that_cannot_fit_get_a_400_naming_the_limit(small_server):
    with small_server.client() as client:
        pool = internal_state(client)["max_total_num_tokens"]
        assert pool <= POOL + 8 and CONTEXT > pool  # the pool, not the context, is the smaller limit
        oai = openai.OpenAI(base_url=small_server.url + "/v1", api_key="none", max_retries=0)
        for ids, max_new, words in _cases(pool):
            r = client.post(
                "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": max_new}}
            )
            assert r.status_code == 400 and words in r.json()["error"]["message"], (words, r.text)
            r = client.post(
                "/generate",
                json={"input_ids": ids, "sampling_params": {"max_new_tokens": max_new}, "stream": True},
            )
            assert r.status_code == 400 and words in r.json()["error"]["message"], (words, r.text)
            with pytest.raises(openai.BadRequestError) as err:
                oai.completions.create(model="default", prompt=ids, max_tokens=max_new)
            assert words in str(err.value)
            with pytest.raises(openai.BadRequestError) as err:
                oai.completions.create(model="default", prompt=ids, max_tokens=max_new, stream=True)
            assert words in str(err.value)
        # the server keeps serving, with nothing held
        r = client.post(
            "/generate",
            json={"input_ids": [7] * 50, "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}},
        )
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 8
        state = wait_idle(client)
        assert state["free_req_slots"] == state["max_req_slots"]


def test_overload_past_max_queued_requests_is_a_503():
    queued, running, total = 4, 2, 24
    handle = launch_server(("--max-queued-requests", str(queued), "--max-running-requests", str(running)))
    try:
        with handle.client() as client:
            before = internal_state(client)

        async def one(aclient: httpx.AsyncClient, i: int) -> tuple[int, str]:
            """/generate, streamed /generate, /v1/completions, streamed /v1/chat/completions in turn
            (a streamed request is refused before its stream starts)."""
            kind = i % 4
            if kind < 2:
                path = "/generate"
                body = {
                    "input_ids": [5, 6, 7, i],
                    "sampling_params": {"max_new_tokens": 64, "ignore_eos": True},
                }
            elif kind == 2:
                path, body = "/v1/completions", {"prompt": [5, 6, 7, i], "max_tokens": 64, "ignore_eos": True}
            else:
                path = "/v1/chat/completions"
                body = {
                    "messages": [{"role": "user", "content": f"hi {i}"}],
                    "max_tokens": 64,
                    "ignore_eos": True,
                }
            if kind in (1, 3):
                body["stream"] = True
                async with aclient.stream("POST", path, json=body) as r:
                    return r.status_code, (await r.aread()).decode()
            r = await aclient.post(path, json=body)
            return r.status_code, r.text

        async def burst() -> list[tuple[int, str]]:
            async with httpx.AsyncClient(base_url=handle.url, timeout=120) as aclient:
                return await asyncio.gather(*(one(aclient, i) for i in range(total)))

        results = asyncio.run(burst())
        statuses = [s for s, _ in results]
        refused = [text for s, text in results if s == 503]
        assert set(statuses) <= {200, 503}, statuses
        assert refused and statuses.count(200) >= queued, statuses
        for text in refused:
            assert "overloaded" in text and f"--max-queued-requests {queued}" in text, text
        assert {i % 4 for i, (s, _) in enumerate(results) if s == 503} == {
            0,
            1,
            2,
            3,
        }, statuses  # every route
        for status, text in results:
            if status == 200 and text.startswith("data:"):
                assert text.rstrip().endswith("data: [DONE]") and "length" in text
        with handle.client() as client:
            after = wait_idle(client)
            assert after["free_req_slots"] == before["free_req_slots"]
            assert after["available_kv_tokens"] == before["available_kv_tokens"]
            r = client.post("/generate", json={"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})
            assert r.status_code == 200
        oai = openai.OpenAI(base_url=handle.url + "/v1", api_key="none", max_retries=0)
        assert (
            oai.completions.create(model="default", prompt=[5, 6], max_tokens=2).usage.completion_tokens == 2
        )
    finally:
        handle.stop()
