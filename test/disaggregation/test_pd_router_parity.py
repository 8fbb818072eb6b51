"""1 prefill + 1 decode server (Mooncake over TCP) behind the upstream `sglang-router`, SmolLM2-135M
GGUF in float32: greedy outputs equal a colocated server's on ragged prompts (several at once,
one longer than the prefill chunk), streaming and not, /generate and both OpenAI routes; the
first chunk's KV of a multi-chunk prompt reaches the decode side before the last chunk's forward
ends; a client that leaves aborts on both sides; afterwards both servers hold no KV.

A second decode server with `--pp-size 2` behind a second router, paired with the same prefill
server (it was test_pd_decode_pp_router.py, which started its own colocated and prefill servers):
each decode stage receives its own layers' KV, and greedy outputs equal the colocated server's on
the same ragged prompts, streaming and not; afterwards it holds no KV and every request came
through the transfer."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from pd_helpers import launch, launch_router, router_stack, wait_kv_restored

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

COMMON = ["--dtype", "float32", "--num-threads", "1"]
CHUNK = 32
PROMPTS = [
    "The capital of France is",
    "Write one sentence about the sea.",
    "1, 2, 3, 4, 5,",
    " ".join(f"word{i}" for i in range(60)),  # > CHUNK tokens: chunked prefill, several transfers
    "Hello",
]
GREEDY = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def servers():
    with router_stack(COMMON, CHUNK) as stack:
        yield stack


def _generate(url: str, text: str, stream: bool = False) -> list[int]:
    body = {"text": text, "sampling_params": GREEDY, "stream": stream}
    if not stream:
        r = httpx.post(url + "/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["output_ids"]
    ids: list[int] = []
    with httpx.stream("POST", url + "/generate", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:") and line.strip() != "data: [DONE]":
                ids = json.loads(line[5:])["output_ids"]  # cumulative
    return ids


def test_constrained_generate_parity(servers):
    """Structured outputs through PD: the prefill side samples the first token under the grammar,
    the decode side advances its matcher over it and continues; the tokens equal the colocated
    server's (a JSON schema and a regex, greedy, to the grammar's end)."""
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}
    cases = [{"json_schema": json.dumps(schema)}, {"regex": r"(yes|no), [0-9]{2}"}]
    for extra in cases:
        body = {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 16, "temperature": 0, **extra}}
        ref, got = (
            httpx.post(s.url + "/generate", json=body, timeout=120)
            for s in (servers["ref"], servers["router"])
        )
        assert ref.status_code == 200 and got.status_code == 200, (ref.text, got.text)
        assert got.json()["output_ids"] == ref.json()["output_ids"], extra
        assert ref.json()["meta_info"]["finish_reason"]["type"] == "stop", ref.json()


@pytest.fixture(scope="module")
def pp_servers(servers):
    """The colocated and prefill servers above, a decode server with `--pp-size 2` and a router."""
    started = []
    try:
        decode = launch([*COMMON, "--pp-size", "2"], "pp-decode", mode="decode")
        started.append(decode)
        started.append(launch_router(servers["prefill"], decode))
        yield {"ref": servers["ref"], "prefill": servers["prefill"], "decode": decode, "router": started[1]}
    finally:
        for p in reversed(started):
            p.stop()


def _parity_ragged_concurrent(servers: dict, stream: bool) -> None:
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        ref = list(pool.map(lambda t: _generate(servers["ref"].url, t, stream), PROMPTS))
        got = list(pool.map(lambda t: _generate(servers["router"].url, t, stream), PROMPTS))
    assert all(len(r) == GREEDY["max_new_tokens"] for r in ref)
    assert got == ref


@pytest.mark.parametrize("stream", [False, True])
def test_generate_parity_ragged_concurrent(servers, stream):
    _parity_ragged_concurrent(servers, stream)


def _openai_answers(url: str) -> dict:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    common = dict(model="default", temperature=0, extra_body={"ignore_eos": True})
    msgs = [{"role": "user", "content": "Name three colours."}]
    chat = client.chat.completions.create(messages=msgs, max_tokens=8, **common)
    chat_stream = list(client.chat.completions.create(messages=msgs, max_tokens=8, stream=True, **common))
    comp = client.completions.create(prompt="The sky is", max_tokens=8, **common)
    comp_stream = list(client.completions.create(prompt="The sky is", max_tokens=8, stream=True, **common))
    return {
        "chat": chat.choices[0].message.content,
        "chat_usage": (chat.usage.prompt_tokens, chat.usage.completion_tokens),
        "chat_stream": "".join(c.choices[0].delta.content or "" for c in chat_stream if c.choices),
        "completion": comp.choices[0].text,
        "completion_stream": "".join(c.choices[0].text for c in comp_stream if c.choices),
        "stream_finish": comp_stream[-1].choices[0].finish_reason,
    }


def test_openai_routes_parity(servers):
    ref = _openai_answers(servers["ref"].url)
    got = _openai_answers(servers["router"].url)
    assert ref["chat_usage"][1] == 8 and ref["stream_finish"] == "length"
    assert ref["chat"] == ref["chat_stream"] and ref["completion"] == ref["completion_stream"]
    assert got == ref


def test_logprobs_parity(servers):
    """The first token's logprobs come from the prefill server, the rest from the decode server."""
    body = {
        "text": "The capital of France is",
        "sampling_params": GREEDY,
        "return_logprob": True,
        "top_logprobs_num": 3,
    }
    ref = httpx.post(servers["ref"].url + "/generate", json=body, timeout=120).json()
    got = httpx.post(servers["router"].url + "/generate", json=body, timeout=120).json()
    assert got["output_ids"] == ref["output_ids"]
    r_lp, g_lp = ref["meta_info"]["output_token_logprobs"], got["meta_info"]["output_token_logprobs"]
    assert len(g_lp) == len(r_lp) == GREEDY["max_new_tokens"]
    for (rl, rt, _), (gl, gt, _) in zip(r_lp, g_lp):
        assert rt == gt and abs(rl - gl) < 1e-4  # float32 on both; same kernels, different batching
    r_top, g_top = ref["meta_info"]["output_top_logprobs"], got["meta_info"]["output_top_logprobs"]
    assert [[t for _, t, _ in pos] for pos in g_top] == [[t for _, t, _ in pos] for pos in r_top]


def test_first_chunk_arrives_before_last_chunk_forward(servers):
    text = " ".join(f"item{i}" for i in range(80))  # several chunks of CHUNK tokens
    ids = _generate(servers["router"].url, text)
    assert len(ids) == GREEDY["max_new_tokens"]
    transfers = servers["prefill"].state()["pd_recent_transfers"]
    mine = max(transfers, key=lambda t: len(t["chunks"]))
    chunks = mine["chunks"]
    assert len(chunks) >= 3, mine
    assert sum(c["tokens"] for c in chunks) > 2 * CHUNK
    # `queued` = that chunk's forward had ended; `done` = its bytes are in the decode server's pool
    assert chunks[0]["done"] < chunks[-1]["queued"], chunks


def test_client_disconnect_aborts_both_sides(servers):
    body = {
        "text": "Tell me a long story.",
        "stream": True,
        "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True},
    }
    with httpx.stream("POST", servers["router"].url + "/generate", json=body, timeout=120) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data:"):
                seen += 1
            if seen >= 3:
                break  # leave mid-generation
    for name in ("prefill", "decode"):
        wait_kv_restored(servers[name], timeout=30)


def test_kv_free_after_everything(servers):
    for name in ("prefill", "decode"):
        state = wait_kv_restored(servers[name], timeout=30)
        assert state["pd_failed_transfers"] == 0 or name == "decode"


def test_prefill_answers_from_the_transfer_thread(servers):
    """The prefill server answers a request as soon as the decode side confirms its KV (the
    transfer manager's thread), not at its scheduler's next step: every answer above that was
    not an abort went that way, and the parity tests above checked their contents."""
    state = servers["prefill"].state()
    assert state["pd_early_answers"] >= 10, state


@pytest.mark.parametrize("stream", [False, True])
def test_decode_pp2_parity(pp_servers, stream):
    _parity_ragged_concurrent(pp_servers, stream)


def test_decode_pp2_transfers_landed_and_kv_free(pp_servers):
    state = pp_servers["decode"].state()
    assert state["pd_landed"] >= 2 * len(PROMPTS) and state["pd_failed_transfers"] == 0, state
    for name in ("prefill", "decode"):
        wait_kv_restored(pp_servers[name], timeout=30)


def test_health_generate_leaves_no_request_behind(pp_servers):
    """A decode server's /health_generate probe waits for a (fake) transfer while the scheduler's
    steps finish, so it is answered from progress and the probe aborted; the answer now comes after
    the probe has left, so a /flush_cache right after it is not refused for a request the user
    never sent (it was, once, on a freshly started decode pp 2 server)."""
    for name in ("decode", "prefill"):
        url = pp_servers[name].url
        for _ in range(5):
            assert httpx.get(url + "/health_generate", timeout=60).status_code == 200
            r = httpx.post(url + "/flush_cache", timeout=30)
            assert r.status_code == 200, (name, r.text)
