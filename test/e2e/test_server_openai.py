"""OpenAI-compatible API end to end (openai client against a real server, tiny Llama, dummy weights).

Random weights give arbitrary but deterministic greedy text, so tests compare the server with
itself (e.g. the same greedy request with and without a stop string), flushing the prefix cache
in between so both runs compute exactly the same way. If a test fails, read the server log first.
"""

from __future__ import annotations

import asyncio

import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from server_helpers import API_KEY, flush

MODEL = "default"
GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def oai(server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def test_models_lists_served_model(oai, server):
    models = oai.models.list()
    assert len(models.data) == 1
    served = models.data[0].id
    assert served.endswith("tiny-llama")
    r = oai.completions.create(model=served, prompt="Hi", max_tokens=2)
    assert r.model == served


def test_chat_completion(oai):
    r = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8, **GREEDY
    )
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens > 4  # the chat template adds role markers
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8
    assert 0 <= r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens


def test_chat_max_completion_tokens(oai):
    r = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=3, **GREEDY
    )
    assert r.usage.completion_tokens == 3


def test_completion_and_cached_tokens(oai, client):
    flush(client)
    prompt = "The quick brown fox jumps over the lazy dog " * 4
    first = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=4, **GREEDY)
    second = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=4, **GREEDY)
    assert first.choices[0].finish_reason == "length"
    assert first.usage.completion_tokens == 4
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens > 0  # radix cache hit


def test_completion_batch_prompts_and_token_prompts(oai):
    r = oai.completions.create(model=MODEL, prompt=["Hello", "World", "Again"], max_tokens=3, **GREEDY)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 9
    r = oai.completions.create(model=MODEL, prompt=[5, 6, 7, 8], max_tokens=2, **GREEDY)
    assert r.usage.prompt_tokens == 4 and r.usage.completion_tokens == 2


def test_streaming_completion_matches_non_streaming(oai, client):
    kwargs = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, **GREEDY)
    flush(client)
    full = oai.completions.create(**kwargs)
    flush(client)
    chunks = list(oai.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert not chunks[-1].choices


def test_streaming_chat_with_usage(oai, client):
    kwargs = dict(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=10, **GREEDY
    )
    flush(client)
    full = oai.chat.completions.create(**kwargs)
    flush(client)
    stream = oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]
    usage = chunks[-1].usage
    assert usage.completion_tokens == 10 and usage.prompt_tokens == full.usage.prompt_tokens


def test_stop_string(oai, client):
    kwargs = dict(model=MODEL, prompt="Hello", max_tokens=24, **GREEDY)
    flush(client)
    text = oai.completions.create(**kwargs).choices[0].text
    clean = [
        i
        for i in range(len(text) // 3, len(text) - 3)
        if "\ufffd" not in text[i : i + 2] and text[i : i + 2].strip()
    ]
    assert clean, f"no usable stop string in {text!r}"
    stop = text[clean[0] : clean[0] + 2]
    expected = text[: text.find(stop)]
    for stream in (False, True):
        flush(client)
        if stream:
            chunks = list(oai.completions.create(stop=[stop], stream=True, **kwargs))
            got = "".join(c.choices[0].text for c in chunks if c.choices)
            reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][
                -1
            ]
            assert all(stop not in c.choices[0].text for c in chunks if c.choices)
        else:
            r = oai.completions.create(stop=stop, **kwargs)
            got, reason = r.choices[0].text, r.choices[0].finish_reason
            assert r.choices[0].model_extra.get("matched_stop") == stop
        assert got == expected
        assert reason == "stop"


def test_n_greater_than_one(oai):
    r = oai.completions.create(model=MODEL, prompt="Hi", max_tokens=6, n=3, temperature=1.0, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 18
    single = oai.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    assert r.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once
    chat = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, n=2, temperature=1.0
    )
    assert sorted(c.index for c in chat.choices) == [0, 1]
    # Seeded sampling is reproducible.
    again = oai.completions.create(model=MODEL, prompt="Hi", max_tokens=6, n=3, temperature=1.0, seed=7)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]


def test_streaming_n_and_echo_match_non_streaming(oai, client):
    kwargs = dict(model=MODEL, prompt=["Hello", "World"], max_tokens=5, n=2, echo=True, **GREEDY)
    flush(client)
    full = oai.completions.create(**kwargs)
    flush(client)
    chunks = list(oai.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    texts: dict[int, str] = {}
    finishes: dict[int, list] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finishes.setdefault(choice.index, []).append(choice.finish_reason)
    assert texts == {c.index: c.text for c in full.choices}
    assert texts[1].startswith("Hello") and texts[2].startswith(
        "World"
    )  # prompt-major: index = prompt * n + sample
    assert finishes == {i: ["length"] for i in range(4)}
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage.completion_tokens == 20 == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_streaming_chat_n_with_logprobs(oai):
    stream = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        n=2,
        logprobs=True,
        top_logprobs=1,
        stream=True,
        **GREEDY,
    )
    roles: list[int] = []
    logprobs = {0: 0, 1: 0}
    finishes: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.role:
                assert (
                    choice.index not in roles and choice.index not in finishes and not logprobs[choice.index]
                )
                roles.append(choice.index)  # the role comes first, once per choice
            if choice.logprobs:
                logprobs[choice.index] += len(choice.logprobs.content)
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert sorted(roles) == [0, 1]
    assert logprobs == {0: 4, 1: 4}
    assert finishes == {0: "length", 1: "length"}


def test_streaming_completion_logprob_offsets(oai):
    chunks = list(
        oai.completions.create(model=MODEL, prompt="Hello", max_tokens=5, logprobs=1, stream=True, **GREEDY)
    )
    tokens, offsets = [], []
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].logprobs:
            tokens += chunk.choices[0].logprobs.tokens
            offsets += chunk.choices[0].logprobs.text_offset
    assert len(tokens) == len(offsets) == 5
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert offsets[-1] <= len("".join(c.choices[0].text for c in chunks if c.choices))


def test_completion_logprobs(oai):
    r = oai.completions.create(model=MODEL, prompt="Hello", max_tokens=5, logprobs=3, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens).startswith(r.choices[0].text[:1])
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0.0
        assert 1 <= len(top) <= 3
        # Greedy: the chosen token is the most likely one.
        assert chosen == pytest.approx(max(top.values()), abs=1e-4)
    assert lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs(oai):
    r = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        **GREEDY,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert entry.logprob <= 0.0
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token


def test_32_concurrent_requests(server):
    async def run():
        aclient = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
        tasks = [
            aclient.completions.create(
                model=MODEL,
                prompt=f"Request number {i}",
                max_tokens=8,
                temperature=0.0,
                extra_body={"ignore_eos": True},
            )
            for i in range(32)
        ]
        try:
            return await asyncio.gather(*tasks)
        finally:
            await aclient.close()

    results = asyncio.run(run())
    assert len(results) == 32
    assert all(r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length" for r in results)


def test_openai_client_errors(oai):
    with pytest.raises(openai.BadRequestError, match="The model `no-such-model` does not exist"):
        oai.completions.create(model="no-such-model", prompt="Hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="invalid regex"):
        oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
            extra_body={"regex": "[a-z"},
        )
    with pytest.raises(openai.BadRequestError, match="invalid json_schema"):
        oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nope"}},
            },
        )
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=-1)
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=str(oai.base_url), api_key="wrong", max_retries=0).models.list()
