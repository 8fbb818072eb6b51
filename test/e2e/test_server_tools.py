"""Tool calling and reasoning end to end (issue 29), with the `openai` client against one real
server of SmolLM2-135M-Instruct (its real weights), `--tool-call-parser qwen25`,
`--reasoning-parser deepseek-v3` (DeepSeek-V3.1's: a reasoning section only when
`chat_template_kwargs.thinking` is true, the output then starting inside it) and a tiny Hermes-style chat template that renders the tools
(`data/hermes_tools.jinja`).

SmolLM2 does not call tools on its own; asked to repeat a `<tool_call>` block verbatim, its greedy
answer is one, which the parser turns into `message.tool_calls` (and stream deltas). `tool_choice`
`required` / a named function are enforced by a `json_schema` constraint: those tests run where
the server has a grammar backend (skipped, saying so, where it refuses `json_schema`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from server_helpers import API_KEY, ServerHandle, launch_server

pytestmark = pytest.mark.slow  # starts its own server

TEMPLATE = Path(__file__).parent / "data" / "hermes_tools.jinja"
# (the prompt SmolLM2 repeats a call for: change it and check that its greedy answer still is one)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
CALL_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
ECHO_CALL = [{"role": "user", "content": f"Repeat exactly: {CALL_TEXT}"}]
HI = [{"role": "user", "content": "hi"}]
THINK = {"chat_template_kwargs": {"thinking": True}}
GREEDY = {"model": "default", "temperature": 0}


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerHandle]:
    from sglang.srt.model_loader.default_model import find_default_model
    from sglang.test.smollm2_reference import cached_hf_dir

    try:
        model = cached_hf_dir(find_default_model())
    except RuntimeError as err:
        pytest.skip(str(err))
    args = ("--load-format", "auto", "--chat-template", str(TEMPLATE))
    args += ("--tool-call-parser", "qwen25", "--reasoning-parser", "deepseek-v3")
    handle = launch_server(args, api_key=API_KEY, model=model)
    yield handle
    handle.stop()


@pytest.fixture
def oai(srv: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0, timeout=600)


@pytest.fixture
def http(srv: ServerHandle) -> Iterator[httpx.Client]:
    with srv.client(timeout=600) as c:
        yield c


def reassemble(chunks) -> tuple[str, str, dict[int, list], list]:
    """(content, reasoning, calls by index as [id, name, arguments], finish reasons) of a stream."""
    content, reasoning, calls, finishes = "", "", {}, []
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for call in delta.tool_calls or []:
                if call.id is not None:
                    assert call.index not in calls and call.function.name and call.type == "function"
                    calls[call.index] = [call.id, call.function.name, call.function.arguments or ""]
                else:
                    assert call.function.name is None
                    calls[call.index][2] += call.function.arguments or ""
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    return content, reasoning, calls, finishes


def test_tool_call_parsed_whole_and_streamed(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(messages=ECHO_CALL, tools=[WEATHER], max_tokens=40, **GREEDY)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert not choice.message.content
    stream = oai.chat.completions.create(
        messages=ECHO_CALL, tools=[WEATHER], max_tokens=40, stream=True, **GREEDY
    )
    content, _reasoning, calls, finishes = reassemble(stream)
    assert finishes == ["tool_calls"] and not content
    assert [(c[1], json.loads(c[2])) for c in calls.values()] == [("get_weather", {"city": "Paris"})]
    # tool_choice none: no tools in the prompt, nothing parsed
    plain = oai.chat.completions.create(
        messages=ECHO_CALL, tools=[WEATHER], tool_choice="none", max_tokens=40, **GREEDY
    )
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content


def test_no_call_is_content_with_stop(oai: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = oai.chat.completions.create(messages=msgs, tools=[WEATHER], max_tokens=24, stop=["."], **GREEDY)
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content


def test_tools_and_history_reach_the_template(oai: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "hi"}]

    def prompt_tokens(**kw) -> int:
        return oai.chat.completions.create(
            messages=kw.pop("messages", msgs), max_tokens=1, **GREEDY, **kw
        ).usage.prompt_tokens

    bare = prompt_tokens()
    assert prompt_tokens(tools=[WEATHER]) > bare
    assert prompt_tokens(tools=[WEATHER, TIME]) > prompt_tokens(tools=[WEATHER])
    assert prompt_tokens(tools=[WEATHER], tool_choice="none") == bare
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    history = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "20 C and sunny"},
    ]
    assert prompt_tokens(messages=history, tools=[WEATHER]) > prompt_tokens(tools=[WEATHER]) + 20


def test_bad_tools_are_400_naming_the_field(oai: openai.OpenAI, http: httpx.Client) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    named = {"type": "function", "function": {"name": "nope"}}
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(messages=msgs, tools=[WEATHER], tool_choice=named, max_tokens=1, **GREEDY)
    assert err.value.body["param"] == "tool_choice" and "nope" in err.value.body["message"]
    r = http.post(
        "/v1/chat/completions", json={"messages": msgs, "tools": [{"type": "function", "function": {}}]}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    r = http.post(
        "/v1/chat/completions", json={"messages": msgs, "tools": [WEATHER], "tool_choice": "always"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text


def test_reasoning_whole_and_streamed(oai: openai.OpenAI) -> None:
    """SmolLM2 never closes a reasoning section: with `thinking` on, its whole answer is reasoning
    (the split itself: tests/unit/test_reasoning_parser.py and the /separate_reasoning test)."""
    common = {"messages": HI, "max_tokens": 12, **GREEDY}
    # thinking off (the default of deepseek-v3): no reasoning section, the text stays content
    text = oai.chat.completions.create(**common).choices[0].message.content
    raw = oai.chat.completions.create(**common, extra_body={**THINK, "separate_reasoning": False})
    assert raw.choices[0].message.content == text and text.strip()
    assert getattr(raw.choices[0].message, "reasoning_content", None) is None
    message = oai.chat.completions.create(**common, extra_body=THINK).choices[0].message
    if "</think>" in text:
        reasoning, _, answer = text.partition("</think>")
        assert (message.reasoning_content, message.content) == (reasoning.strip(), answer.strip())
    else:
        assert message.reasoning_content == text.strip() and message.content is None
    for stream_reasoning in (True, False):
        extra = {**THINK, "stream_reasoning": stream_reasoning}
        chunks = list(oai.chat.completions.create(**common, stream=True, extra_body=extra))
        content, reasoning_text, _calls, _finishes = reassemble(chunks)
        pieces = [c for c in chunks if c.choices and getattr(c.choices[0].delta, "reasoning_content", None)]
        assert reasoning_text.strip() == message.reasoning_content and content == (message.content or "")
        assert (len(pieces) > 1) == stream_reasoning  # off: the reasoning in one delta


def test_parse_routes(http: httpx.Client) -> None:
    r = http.post("/parse_function_call", json={"text": "Sure. " + CALL_TEXT, "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "normal_text": "Sure. ",
        "calls": [{"tool_index": 0, "name": "get_weather", "parameters": '{"city": "Paris"}'}],
    }
    r = http.post(
        "/parse_function_call", json={"text": "[get_time()]", "tools": [TIME], "tool_call_parser": "pythonic"}
    )
    assert r.json()["calls"] == [{"tool_index": 0, "name": "get_time", "parameters": "{}"}]
    r = http.post("/parse_function_call", json={"text": "x", "tools": [TIME], "tool_call_parser": "nope"})
    assert r.status_code == 400 and "qwen25" in r.json()["error"]["message"]
    r = http.post("/separate_reasoning", json={"text": "<think>hmm</think>Hi"})
    assert r.json() == {"text": "Hi", "reasoning_text": "hmm"}
    r = http.post("/separate_reasoning", json={"text": "hmm</think>Hi", "reasoning_parser": "deepseek-r1"})
    assert r.json() == {"text": "Hi", "reasoning_text": "hmm"}


def _accepts_json_schema(http: httpx.Client) -> bool:
    body = {"text": "a", "sampling_params": {"max_new_tokens": 1, "json_schema": '{"type": "object"}'}}
    return http.post("/generate", json=body).status_code == 200


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_choice_is_enforced(oai: openai.OpenAI, http: httpx.Client, choice) -> None:
    if not _accepts_json_schema(http):
        pytest.skip(
            "this server refuses json_schema (no grammar backend): tool_choice required / named cannot be enforced"
        )
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = oai.chat.completions.create(
        messages=msgs, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=64, **GREEDY
    )
    result = r.choices[0]
    assert result.finish_reason == "tool_calls", result
    names = [c.function.name for c in result.message.tool_calls]
    assert names and set(names) <= ({"get_time"} if isinstance(choice, dict) else {"get_weather", "get_time"})
    assert all(isinstance(json.loads(c.function.arguments), dict) for c in result.message.tool_calls)
    stream = oai.chat.completions.create(
        messages=msgs, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=64, stream=True, **GREEDY
    )
    _content, _reasoning, calls, finishes = reassemble(stream)
    assert finishes == ["tool_calls"]
    assert [(c[1], json.loads(c[2])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in result.message.tool_calls
    ]
