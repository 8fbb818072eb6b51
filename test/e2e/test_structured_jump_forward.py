"""Jump-forward for structured outputs (issue 29, `--enable-jump-forward`) on a real server: SmolLM2
(the embedded GGUF, float32), xgrammar, a JSON schema with long fixed keys.

The output parses and matches the schema; the forced keys are appended without a decode step each
(the scheduler's forward count for the request is below its completion tokens, which are one
forward each with jump-forward off, and `jump_forward_tokens` counts them); streaming gives the
same text; logprobs cover every output token (0.0 for jumped ones); concurrent constrained requests
with client aborts and a small KV pool (retractions) leave nothing behind. Jump-forward off (the
default) keeps the exact tokens of before: test_structured_outputs.py's parity with a masked
transformers loop."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from server_helpers import flush, internal_state, launch_server, leaks_after_load, wait_idle

from sglang.srt.model_loader.default_model import find_default_model
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.long_key_schema import SCHEMA_TEXT, check

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

MAX_NEW = 80


@pytest.fixture(scope="module")
def server():
    args = (
        "--load-format",
        "auto",
        "--num-threads",
        "1",
        "--enable-jump-forward",
        "--max-total-tokens",
        "256",
    )
    handle = launch_server(args, model=find_default_model())
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def prompt():
    tokenizer = get_tokenizer(find_default_model())
    messages = [{"role": "user", "content": "Describe a customer as JSON."}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def body(prompt: str, **extra) -> dict:
    params = {"temperature": 0, "max_new_tokens": MAX_NEW, "json_schema": SCHEMA_TEXT}
    return {"text": prompt, "sampling_params": params, **extra}


def test_jump_forward_output_and_fewer_steps(server, prompt):
    with server.client() as client:
        before = wait_idle(client)
        r = client.post("/generate", json=body(prompt), timeout=300)
        assert r.status_code == 200, r.text
        out = r.json()
        after = internal_state(client)
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out
    check(out["text"])
    completion = out["meta_info"]["completion_tokens"]
    assert completion == len(out["output_ids"])
    steps = after["forward_ct"] - before["forward_ct"]  # prefill + one per sampled token
    jumped = after["jump_forward_tokens"] - before["jump_forward_tokens"]
    # jump-forward off: 1 prefill + (completion - 1) decodes = completion steps
    assert jumped >= 3 * 4 and steps < completion - 10, (steps, completion, jumped)


def test_stream_and_logprobs(server, prompt):
    whole = httpx.post(server.url + "/generate", json=body(prompt), timeout=300).json()
    pieces = []
    req = body(prompt, stream=True)
    with httpx.stream("POST", server.url + "/generate", json=req, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                pieces.append(json.loads(line[5:])["text"])
    assert pieces and pieces[-1] == whole["text"]  # /generate streams the text so far
    lp = httpx.post(
        server.url + "/generate", json=body(prompt, return_logprob=True, top_logprobs_num=2), timeout=300
    ).json()
    assert lp["text"] == whole["text"]
    meta = lp["meta_info"]
    n = meta["completion_tokens"]
    assert len(meta["output_token_logprobs"]) == n and len(meta["output_top_logprobs"]) == n
    assert [e[1] for e in meta["output_token_logprobs"]] == lp["output_ids"]
    zeros = sum(1 for e in meta["output_token_logprobs"] if e[0] == 0.0)
    assert zeros >= 3 * 4  # the jumped key tokens (at least 4 per key)


def test_aborts_and_retractions_leak_nothing(server, prompt):
    async def run() -> list:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:

            async def one(i: int):
                req = body(prompt)
                req["sampling_params"].update(temperature=0.8, seed=i)
                call = http.post("/generate", json=req)
                if i % 3 == 0:
                    try:
                        return await asyncio.wait_for(call, 0.5 + 0.3 * i)
                    except asyncio.TimeoutError:
                        return None
                return await call

            return await asyncio.gather(*(one(i) for i in range(9)))

    with server.client() as client:
        flush(client)
        initial = internal_state(client)
        results = asyncio.run(run())
        for r in results:
            if r is not None:
                assert r.status_code == 200, r.text
                reason = r.json()["meta_info"]["finish_reason"]["type"]
                assert reason in ("stop", "length"), r.json()
                if reason == "stop":
                    check(r.json()["text"])
        leaks = leaks_after_load(client, initial)
        assert all(v == 0 for v in leaks.values()), leaks
        assert internal_state(client)["num_retractions"] > 0  # the small pool retracted requests
