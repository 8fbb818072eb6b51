"""Structured outputs (issue 29) on a real server: SmolLM2 (the embedded GGUF, float32), xgrammar.

Every constraint kind on /generate and /v1 gives output that parses / matches; greedy constrained
output equals a reference loop that applies the same xgrammar bitmask to transformers' float32
logits; an invalid grammar is a 400 naming the error and the server keeps serving; concurrent
constrained requests with aborts leak no KV slot and no matcher."""

from __future__ import annotations

import json
import random
import re
import threading

import httpx
import pytest
from server_helpers import flush, internal_state, launch_server, wait_idle

from sglang.srt.constrained.grammar_spec import GrammarSpec
from sglang.srt.model_loader.default_model import find_default_model
from sglang.srt.utils.hf_transformers_utils import get_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 1},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
REGEX = r"(yes|no), [0-9]{2}"
EBNF = 'root ::= "The answer is " ("A" | "B" | "C") "."'
STRUCTURAL_TAG = {
    "type": "structural_tag",
    "structures": [{"begin": "<city>", "schema": {"type": "string", "maxLength": 10}, "end": "</city>"}],
    "triggers": ["<city>"],
}
PROMPT = "Describe a person as JSON with name, age, role, tags and address."
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def server():
    handle = launch_server(("--load-format", "auto", "--num-threads", "1"), model=find_default_model())
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer(find_default_model())


def chat_text(tokenizer, content: str) -> str:
    messages = [{"role": "user", "content": content}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def generate(server, text: str, **params) -> dict:
    body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_TOKENS, **params}}
    r = httpx.post(server.url + "/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def check_person(obj: dict) -> None:
    assert set(obj) == {"name", "age", "role", "tags", "address"}
    assert isinstance(obj["age"], int) and 0 <= obj["age"] <= 120
    assert obj["role"] in ("admin", "user", "guest")
    assert isinstance(obj["tags"], list) and len(obj["tags"]) <= 1
    assert set(obj["address"]) == {"city"}


def test_generate_every_kind(server, tokenizer):
    text = chat_text(tokenizer, PROMPT)
    out = generate(server, text, json_schema=json.dumps(PERSON))
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out
    check_person(json.loads(out["text"]))
    out = generate(server, chat_text(tokenizer, "Do you like tea? How old are you?"), regex=REGEX)
    assert re.fullmatch(REGEX, out["text"]), out["text"]
    out = generate(server, chat_text(tokenizer, "Pick A, B or C."), ebnf=EBNF)
    assert re.fullmatch(r"The answer is [ABC]\.", out["text"]), out["text"]
    out = generate(server, text, json_schema="$$ANY$$", max_new_tokens=MAX_TOKENS)
    assert out["text"].lstrip()[:1] in '{["-0123456789tfn'
    prompt = chat_text(tokenizer, "Name a city in the form <city>NAME</city>.")
    out = generate(server, prompt + "<city>", structural_tag=json.dumps(STRUCTURAL_TAG), max_new_tokens=24)
    assert out["meta_info"]["finish_reason"] is not None


def ask(content: str, max_tokens: int) -> dict:
    """The common fields of a greedy chat request."""
    return dict(
        model="default", messages=[{"role": "user", "content": content}], max_tokens=max_tokens, temperature=0
    )


def test_v1_response_formats(server):
    import openai

    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="EMPTY", max_retries=0)
    messages = [{"role": "user", "content": PROMPT}]
    r = oai.chat.completions.create(
        model="default",
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    assert r.choices[0].finish_reason == "stop"
    check_person(json.loads(r.choices[0].message.content))
    r = oai.chat.completions.create(
        model="default",
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.lstrip().startswith("{")
    r = oai.completions.create(
        model="default",
        prompt="Q: Is the sky blue?\nA:",
        max_tokens=16,
        temperature=0,
        extra_body={"regex": REGEX},
    )
    assert re.fullmatch(REGEX, r.choices[0].text), r.choices[0].text
    r = oai.chat.completions.create(**ask("Pick A, B or C.", 16), extra_body={"ebnf": EBNF})
    assert re.fullmatch(r"The answer is [ABC]\.", r.choices[0].message.content)
    stream = oai.chat.completions.create(
        model="default",
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    check_person(json.loads("".join(c.choices[0].delta.content or "" for c in stream if c.choices)))


def test_greedy_equals_masked_transformers(server, tokenizer):
    from sglang.test.grammar_reference import GrammarReference

    eos = [tokenizer.eos_token_id]
    ref = GrammarReference(find_default_model(), tokenizer, 49152, eos)
    cases = [
        (chat_text(tokenizer, PROMPT), GrammarSpec("json_schema", json.dumps(PERSON)), 48),
        (chat_text(tokenizer, "Do you like tea? How old are you?"), GrammarSpec("regex", REGEX), 16),
    ]
    for text, spec, n in cases:
        out = generate(server, text, max_new_tokens=n, **{spec.kind: spec.text})
        ids = tokenizer.encode(text)
        expected = ref.greedy(ids, spec, n)
        got = out["output_ids"]
        strip = lambda t: t[:-1] if t and t[-1] in eos else t  # noqa: E731
        assert strip(got) == strip(expected), (tokenizer.decode(got), tokenizer.decode(expected))


def test_invalid_grammar_is_400_and_server_keeps_serving(server, tokenizer):
    for params in ({"json_schema": '{"type": "nope"}'}, {"regex": "a("}, {"ebnf": "root ::= foo"}):
        r = httpx.post(server.url + "/generate", json={"text": "hi", "sampling_params": params}, timeout=60)
        assert r.status_code == 400, r.text
        assert "invalid" in r.text
    r = httpx.post(
        server.url + "/generate",
        json={"text": "hi", "sampling_params": {"regex": "a+", "ebnf": 'root ::= "a"'}},
    )
    assert r.status_code == 400 and "only one" in r.text
    out = generate(server, chat_text(tokenizer, "Hi"), regex="[a-z]{3}", max_new_tokens=8)
    assert re.fullmatch("[a-z]{3}", out["text"])
    # the scheduler built (and refused) those grammars: the HTTP process never loads xgrammar nor
    # the torch it imports (~2 s on its event loop, which held back every stream it serves)
    with open(f"/proc/{server.proc.pid}/maps") as f:
        maps = f.read()
    assert "libtorch" not in maps and "xgrammar" not in maps


def test_concurrent_constrained_requests_with_aborts(server, tokenizer):
    rng = random.Random(0)
    text = chat_text(tokenizer, PROMPT)
    schemas = [json.dumps({**PERSON, "title": f"p{i % 4}"}) for i in range(16)]
    results: dict[int, object] = {}

    def one(i: int) -> None:
        body = {"text": text, "sampling_params": {"temperature": 0.7, "seed": i, "max_new_tokens": 40}}
        body["sampling_params"]["json_schema" if i % 2 else "regex"] = schemas[i] if i % 2 else REGEX
        try:
            timeout = 0.5 + rng.random() * 2 if i % 3 == 0 else 300  # client gone: the server aborts
            results[i] = httpx.post(server.url + "/generate", json=body, timeout=timeout).status_code
        except httpx.TimeoutException:
            results[i] = "aborted"

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(v in (200, "aborted") for v in results.values()), results
    with server.client() as client:
        state = wait_idle(client, timeout=120)
        assert state["grammar_matchers"] == 0 and state["grammar_queue"] == 0, state
        flush(client)
        state = internal_state(client)
        assert state["available_kv_tokens"] == state["max_total_num_tokens"], state
