"""Clients that give up: a non-streaming request whose client disconnects, and a streaming one
whose client leaves before its first token (during a long chunked prefill), are aborted by the
server within seconds, not run to their max_new_tokens; their KV and request rows come back."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from mid_llama import make_mid_llama
from server_helpers import internal_state, launch_server, wait_idle, wait_until

pytestmark = pytest.mark.slow  # starts its own server

LONG = {"max_new_tokens": 3000, "ignore_eos": True}


def _aborted(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    return float(re.search(r"^sglang:num_aborted_requests_total\{[^}]*\} ([0-9.e+]+)$", text, re.M).group(1))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """8 layers x 512: 3000 tokens take many seconds however fast the kernels are."""
    model = make_mid_llama(tmp_path_factory.mktemp("models"))
    args = (
        "--enable-metrics",
        "--num-threads",
        "1",
        "--chunked-prefill-size",
        "16",
        "--max-total-tokens",
        "16384",
    )
    handle = launch_server(args, model=model)
    yield handle
    handle.stop()


async def _give_up(url: str, path: str, body: dict, after_s: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        try:
            await asyncio.wait_for(client.post(path, json=body), after_s)
        except asyncio.TimeoutError:
            return  # the request is cancelled and its connection closed
    raise AssertionError(f"{path} finished before the client gave up")


def test_non_streaming_clients_that_leave_are_aborted(server):
    with server.client() as client:
        before, aborted_before = internal_state(client), _aborted(client)
        bodies = [
            ("/generate", {"input_ids": [5, 6, 7], "sampling_params": LONG}),
            ("/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3000, "ignore_eos": True}),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000, "ignore_eos": True},
            ),
        ]

        async def all_leave() -> None:
            await asyncio.gather(*(_give_up(server.url, p, b, 1.0) for p, b in bodies))

        asyncio.run(all_leave())
        left = time.monotonic()
        # 3000 tokens each would take far longer than this: they must have been aborted
        assert wait_until(lambda: internal_state(client)["num_running_reqs"] == 0, 10.0), internal_state(
            client
        )
        # the abort results travel scheduler -> detokenizer -> tokenizer manager after the
        # scheduler dropped the requests: wait for the counter rather than read it once
        assert wait_until(lambda: _aborted(client) - aborted_before >= len(bodies), 10.0), _aborted(client)
        assert time.monotonic() - left < 10.0
        assert _aborted(client) - aborted_before == len(bodies)
        after = wait_idle(client)
        assert after["available_kv_tokens"] == before["available_kv_tokens"]
        assert after["free_req_slots"] == before["free_req_slots"]


def test_stream_left_before_its_first_token_is_aborted(server):
    with server.client() as client:
        before, aborted_before = internal_state(client), _aborted(client)
        # 4000 prompt tokens in chunks of 16: the first token is 250 steps away
        body = {
            "input_ids": [5 + i % 400 for i in range(4000)],
            "sampling_params": {"max_new_tokens": 16},
            "stream": True,
        }

        async def leave() -> None:
            async with httpx.AsyncClient(base_url=server.url, timeout=600) as aclient:
                try:
                    async with asyncio.timeout(0.3):
                        async with aclient.stream("POST", "/generate", json=body) as r:
                            async for _ in r.aiter_lines():
                                raise AssertionError("a chunk came before the client left")
                except TimeoutError:
                    return

        asyncio.run(leave())
        assert wait_until(lambda: internal_state(client)["num_running_reqs"] == 0, 10.0), internal_state(
            client
        )
        assert wait_until(lambda: _aborted(client) - aborted_before >= 1, 10.0), _aborted(client)
        assert _aborted(client) - aborted_before == 1
        after = wait_idle(client)
        assert after["available_kv_tokens"] == before["available_kv_tokens"]
        assert after["free_req_slots"] == before["free_req_slots"]
