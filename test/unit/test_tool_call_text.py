"""Text around tool calls (issue 29): what a model writes before, between and after its calls is
content, streamed or not, and the streamed content equals the non-streamed one for every chunking;
Mistral's newer `[TOOL_CALLS]name[ARGS]{...}` form beside its JSON array."""

from __future__ import annotations

import json

import pytest
from test_chat_tool_output import chat, parsing
from test_function_call import DS, DSC, DSE, DSF, DSS, TOOLS, T, W, chunkings, js, stream

from sglang.srt.entrypoints.openai.chat_output import ChoiceOutput
from sglang.srt.function_call import JsonArrayDetector, make_detector

QWEN = '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>'
# parser -> (model output, content, calls)
AROUND = {
    "qwen25": (
        f"Let me check.\n{QWEN.format('get_weather', js(W))}\nAnd the time:\n"
        f"{QWEN.format('get_time', js(T))}\nDone, both asked.",
        "Let me check.\n\nAnd the time:\n\nDone, both asked.",
    ),
    "deepseekv31": (
        f"Checking.{DS}{DSC}get_weather{DSS}{js(W)}{DSE}{DSC}get_time{DSS}{js(T)}{DSE}{DSF} Both sent.",
        "Checking. Both sent.",
    ),
    "deepseekv3": (
        f"Checking.{DS}{DSC}function{DSS}get_weather\n```json\n{js(W)}\n```{DSE}\n"
        f"{DSC}function{DSS}get_time\n```json\n{js(T)}\n```{DSE}{DSF}\nBoth sent.",
        "Checking.\nBoth sent.",
    ),
    "mistral": (
        f'Sure. [TOOL_CALLS] [{{"name": "get_weather", "arguments": {js(W)}}}, '
        f'{{"name": "get_time", "arguments": {js(T)}}}] Anything else?',
        "Sure.  Anything else?",
    ),
    "mistral-named": (
        f"Sure.[TOOL_CALLS]get_weather[ARGS]{js(W)}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{js(T)} ok",
        "Sure. ok",
    ),
}
CALLS = [("get_weather", W), ("get_time", T)]
PYTHONIC = (
    '[get_weather(city="Paris", unit="celsius", days=[1, 2], note=\'say "hi" {ok}\'), get_time(zone="CET")]'
)
AROUND["pythonic"] = (f"Let me see. {PYTHONIC} Then [one] more.", "Let me see.  Then [one] more.")
AROUND["pythonic-tagged"] = (f"Sure <|python_start|>{PYTHONIC}<|python_end|> done", "Sure  done")


def detector(case: str):
    return make_detector(case.split("-")[0])


@pytest.mark.parametrize("case", sorted(AROUND))
def test_text_between_and_after_calls_is_content(case: str) -> None:
    text, content = AROUND[case]
    result = detector(case).detect_and_parse(text, TOOLS)
    assert result.normal_text == content
    assert [(c.name, json.loads(c.parameters)) for c in result.calls] == CALLS
    for seed in range(12):
        assert stream(detector(case), chunkings(text, seed)) == (content, CALLS), seed
    assert stream(detector(case), list(text)) == (content, CALLS)


@pytest.mark.parametrize("case", ["qwen25", "mistral-named"])
def test_blank_between_calls_is_no_content(case: str) -> None:
    if case == "qwen25":
        text = f"{QWEN.format('get_weather', js(W))}\n\n{QWEN.format('get_time', js(T))}\n"
    else:
        text = f"[TOOL_CALLS]get_weather[ARGS]{js(W)}\n[TOOL_CALLS]get_time[ARGS]{js(T)}\n"
    assert detector(case).detect_and_parse(text, TOOLS).normal_text == ""
    for seed in range(6):
        assert stream(detector(case), chunkings(text, seed)) == ("", CALLS)


def test_mistral_named_form() -> None:
    text = f"[TOOL_CALLS]get_weather[ARGS]{js(W)}"
    result = make_detector("mistral").detect_and_parse(text, TOOLS)
    assert [(c.name, json.loads(c.parameters), c.tool_index) for c in result.calls] == [("get_weather", W, 0)]
    assert result.normal_text == ""
    # an unfinished call is no call; arguments stream in pieces as they are written
    assert make_detector("mistral").detect_and_parse(text[:-3], TOOLS).calls == []
    d = make_detector("mistral")
    fragments = sum(1 for ch in text for c in d.parse_streaming_increment(ch, TOOLS).calls if c.name is None)
    assert fragments > 10
    # a function that is not a tool is dropped, the other call keeps index 0
    text = f"[TOOL_CALLS]nope[ARGS]{{}}[TOOL_CALLS]get_time[ARGS]{js(T)}"
    result = make_detector("mistral").detect_and_parse(text, TOOLS)
    assert [(c.name, c.tool_index) for c in result.calls] == [("get_time", 0)]
    assert stream(make_detector("mistral"), chunkings(text, 3)) == ("", [("get_time", T)])


def test_json_array_text_after_the_array() -> None:
    text = '[{"name": "get_time", "parameters": {}}] trailing'
    assert JsonArrayDetector().detect_and_parse(text, TOOLS).normal_text == " trailing"
    assert stream(JsonArrayDetector(), chunkings(text, 2)) == (" trailing", [("get_time", {})])


@pytest.mark.parametrize("seed", range(4))
def test_chat_stream_keeps_content_after_calls(seed: int) -> None:
    """Through the chat serving's parsers (qwen3 reasoning + qwen25 tools): the streamed deltas and
    the finished message carry the same content, the text after the calls included."""
    text, content = AROUND["qwen25"]
    text = "<think>Weather and time.</think>" + text
    req = chat(tools=TOOLS)
    message = ChoiceOutput(parsing(req)).message(text)
    assert message.content == content and len(message.tool_calls) == 2
    output = ChoiceOutput(parsing(req))
    streamed, names = "", []
    for piece in chunkings(text, seed) + [None]:
        delta, calls = output.deltas(piece) if piece is not None else (output.finish(), [])
        streamed += delta.content or ""
        names += [d.tool_calls[0].function.name for d in calls if d.tool_calls[0].id]
    assert streamed == content and names == ["get_weather", "get_time"]
