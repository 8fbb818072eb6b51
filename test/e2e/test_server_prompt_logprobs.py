"""Prompt logprobs against a live server (SmolLM2 weights, float32, chunks of 8 tokens): upstream's
`/generate` fields as the frontend language's `select` sends them, `/v1/completions` with `echo` +
`logprobs` through the `openai` SDK (lm-eval's loglikelihood), `stop_regex` empty and set; the
values against transformers' float32 forward within 2e-3."""

from __future__ import annotations

import pytest
from openai import OpenAI

from server_helpers import launch_server
from sglang.test import prompt_logprobs_reference as plr


@pytest.fixture(scope="module")
def live():
    handle = launch_server(
        ("--load-format", "auto", "--chunked-prefill-size", "8"), model=plr.smollm2_hf_dir()
    )
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def ref():
    prompt = list(plr.prompt_ids())
    return prompt, plr.reference(prompt)


def test_generate_prompt_logprobs_batch(live, ref):
    prompt, lsm = ref
    n = len(prompt)
    body = {
        "text": [plr.PROMPT_TEXT, plr.PROMPT_TEXT],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0, "stop_regex": []},
        "return_logprob": True,
        "return_text_in_logprobs": True,
        "logprob_start_len": [0, n - 2],
        "top_logprobs_num": 2,
    }
    with live.client() as c:
        r = c.post("/generate", json=body)
    assert r.status_code == 200, r.text
    outs = r.json()
    for out, start in zip(outs, [0, n - 2]):
        meta = out["meta_info"]
        plr.check_entries(meta["input_token_logprobs"], prompt, start, lsm, f"start {start}")
        plr.check_top(meta["input_top_logprobs"], start, lsm, 2, f"start {start}")
        assert all(isinstance(e[2], str) for e in meta["input_token_logprobs"])
        assert meta["output_token_logprobs"] == [] and out["output_ids"] == []
    assert "".join(e[2] for e in outs[0]["meta_info"]["input_token_logprobs"]) == plr.PROMPT_TEXT


def test_generate_stop_regex(live):
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    with live.client() as c:
        free = c.post("/generate", json={"text": plr.PROMPT_TEXT, "sampling_params": params}).json()
        stopped = c.post(
            "/generate", json={"text": plr.PROMPT_TEXT, "sampling_params": {**params, "stop_regex": r"\w+\."}}
        ).json()
    assert stopped["meta_info"]["finish_reason"]["type"] == "stop"
    matched = stopped["meta_info"]["finish_reason"]["matched"]
    assert matched.endswith(".") and matched in free["text"]
    assert free["text"].startswith(stopped["text"]) and matched not in stopped["text"]


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_completions_echo_logprobs(live, ref, max_tokens):
    prompt, lsm = ref
    oai = OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0, timeout=60)
    r = oai.completions.create(
        model="default", prompt=plr.PROMPT_TEXT, max_tokens=max_tokens, echo=True, logprobs=1, temperature=0
    )
    lp = r.choices[0].logprobs
    n = len(prompt)
    assert len(lp.tokens) == n + max_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    plr.check_entries(list(zip(lp.token_logprobs[:n], prompt)), prompt, 0, lsm, "echo")
    assert "".join(lp.tokens[:n]) == plr.PROMPT_TEXT
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    assert all(a <= b for a, b in zip(lp.text_offset, lp.text_offset[1:]))
    for t in range(1, n):
        ((text, value),) = lp.top_logprobs[t].items()
        assert abs(value - float(lsm[t - 1].max())) <= plr.TOL
    assert r.choices[0].text.startswith(plr.PROMPT_TEXT)
    if max_tokens:
        assert abs(lp.token_logprobs[n] - float(lsm[-1].max())) <= plr.TOL


def test_completions_echo_logprobs_stream(live, ref):
    prompt, lsm = ref
    n = len(prompt)
    oai = OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0, timeout=60)
    kwargs = dict(model="default", prompt=plr.PROMPT_TEXT, max_tokens=2, echo=True, logprobs=1, temperature=0)
    whole = oai.completions.create(**kwargs).choices[0].logprobs
    tokens, values, offsets = [], [], []
    for chunk in oai.completions.create(stream=True, **kwargs):
        lp = chunk.choices[0].logprobs if chunk.choices else None
        if lp is not None:
            tokens += lp.tokens
            values += lp.token_logprobs
            offsets += lp.text_offset
    assert tokens == whole.tokens and offsets == whole.text_offset and len(tokens) == n + 2
    assert (
        values[0] is None and max(abs(a - b) for a, b in zip(values[1:], whole.token_logprobs[1:])) <= plr.TOL
    )


def test_chat_without_max_tokens_runs_to_eos(live):
    """No max_tokens on /v1/chat/completions (upstream: to EOS or the context limit): the real
    SmolLM2 weights answer and stop on their own end-of-turn token, not on a length limit."""
    client = OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0, timeout=300)
    out = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "stop", (choice.finish_reason, choice.message.content)
    assert "Paris" in choice.message.content
    assert 0 < out.usage.completion_tokens < 128  # stopped by EOS, under /generate's default 128
