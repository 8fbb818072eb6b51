"""Each `--tool-call-parser` on canned model outputs: the complete parse, and the same output
streamed in random chunkings reassembling to the same calls and content."""

from __future__ import annotations

import json
import random

import pytest

from sglang.srt.function_call import JsonArrayDetector, make_detector, tool_call_parser_names
from sglang.srt.function_call.constraint import tool_call_schema

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
W = {"city": "Paris", "unit": "celsius", "days": [1, 2], "note": 'say "hi" {ok}'}
T = {"zone": "CET"}
DS = "<｜tool▁calls▁begin｜>"
DSC = "<｜tool▁call▁begin｜>"
DSS = "<｜tool▁sep｜>"
DSE = "<｜tool▁call▁end｜>"
DSF = "<｜tool▁calls▁end｜>"


def js(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)


# parser -> (model output, expected content, expected calls as (name, arguments))
CASES = {
    "qwen25": (
        f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {js(W)}}}\n</tool_call>\n'
        f'<tool_call>\n{{"name": "get_time", "arguments": {js(T)}}}\n</tool_call>',
        "Let me check.\n",
        [("get_weather", W), ("get_time", T)],
    ),
    "llama3": (
        f'<|python_tag|>{{"name": "get_weather", "parameters": {js(W)}}}; {{"name": "get_time", "parameters": {js(T)}}}',
        "",
        [("get_weather", W), ("get_time", T)],
    ),
    "mistral": (
        f'Sure. [TOOL_CALLS] [{{"name": "get_weather", "arguments": {js(W)}}}, {{"name": "get_time", "arguments": {js(T)}}}]',
        "Sure. ",
        [("get_weather", W), ("get_time", T)],
    ),
    "deepseekv3": (
        f"Checking.{DS}{DSC}function{DSS}get_weather\n```json\n{js(W)}\n```{DSE}\n"
        f"{DSC}function{DSS}get_time\n```json\n{js(T)}\n```{DSE}{DSF}",
        "Checking.",
        [("get_weather", W), ("get_time", T)],
    ),
    "deepseekv31": (
        f"Checking.{DS}{DSC}get_weather{DSS}{js(W)}{DSE}{DSC}get_time{DSS}{js(T)}{DSE}{DSF}",
        "Checking.",
        [("get_weather", W), ("get_time", T)],
    ),
    "pythonic": (
        '[get_weather(city="Paris", unit="celsius", days=[1, 2], note=\'say "hi" {ok}\'), get_time(zone="CET")]',
        "",
        [("get_weather", W), ("get_time", T)],
    ),
}


def chunkings(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(text):
        n = rng.choice([1, 1, 2, 3, 5, 8, 13])
        pieces.append(text[i : i + n])
        i += n
    return pieces


def stream(detector, pieces: list[str], tools=TOOLS) -> tuple[str, list[tuple[str, dict]]]:
    """Feed the pieces; reassemble content and calls as an OpenAI client would."""
    content, names, args = "", {}, {}
    for piece in pieces:
        result = detector.parse_streaming_increment(piece, tools)
        content += result.normal_text
        for item in result.calls:
            if item.name is not None:
                assert item.tool_index not in names and item.parameters == ""
                names[item.tool_index] = item.name
                args[item.tool_index] = ""
            else:
                args[item.tool_index] += item.parameters
    content += detector.flush()
    assert sorted(names) == list(range(len(names)))
    return content, [(names[i], json.loads(args[i])) for i in sorted(names)]


def test_every_upstream_name_is_registered() -> None:
    assert {"qwen25", "llama3", "mistral", "deepseekv3", "deepseekv31", "pythonic"} <= set(
        tool_call_parser_names()
    )
    with pytest.raises(ValueError, match="qwen25"):
        make_detector("nope")


@pytest.mark.parametrize("parser", sorted(CASES))
def test_complete_output(parser: str) -> None:
    text, content, calls = CASES[parser]
    detector = make_detector(parser)
    assert detector.has_tool_call(text)
    result = detector.detect_and_parse(text, TOOLS)
    assert result.normal_text == content
    assert [(c.name, json.loads(c.parameters)) for c in result.calls] == calls
    assert [c.tool_index for c in result.calls] == list(range(len(calls)))


@pytest.mark.parametrize("parser", sorted(CASES))
@pytest.mark.parametrize("seed", range(8))
def test_streamed_in_random_chunks(parser: str, seed: int) -> None:
    text, content, calls = CASES[parser]
    got_content, got_calls = stream(make_detector(parser), chunkings(text, seed))
    assert got_content == content
    assert got_calls == calls


@pytest.mark.parametrize("parser", sorted(CASES))
def test_streamed_one_character_at_a_time_sends_arguments_in_pieces(parser: str) -> None:
    text, _content, calls = CASES[parser]
    detector = make_detector(parser)
    fragments = 0
    for ch in text:
        fragments += sum(1 for c in detector.parse_streaming_increment(ch, TOOLS).calls if c.name is None)
    if parser == "pythonic":
        assert fragments == len(calls)  # a pythonic call goes out whole once its ')' is written
    else:
        assert fragments > 10 * len(calls)  # the arguments stream as they are written


@pytest.mark.parametrize("parser", sorted(CASES))
def test_plain_text_is_content(parser: str) -> None:
    text = "The weather in Paris is [mild] {usually}, 20 C. <tool"
    detector = make_detector(parser)
    assert detector.detect_and_parse(text, TOOLS).normal_text == text
    assert detector.detect_and_parse(text, TOOLS).calls == []
    for seed in range(3):
        assert stream(make_detector(parser), chunkings(text, seed)) == (text, [])


@pytest.mark.parametrize("parser", ["qwen25", "deepseekv31", "mistral"])
def test_unknown_function_is_dropped(parser: str) -> None:
    text = CASES[parser][0]
    only_time = [TOOLS[1]]
    result = make_detector(parser).detect_and_parse(text, only_time)
    assert [(c.name, c.tool_index) for c in result.calls] == [("get_time", 0)]
    _content, calls = stream(make_detector(parser), chunkings(text, 1), only_time)
    assert calls == [("get_time", T)]
    # no known call at all: the whole output is content
    assert make_detector(parser).detect_and_parse(text, []).normal_text == text


def test_truncated_call_is_not_a_call() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    result = make_detector("qwen25").detect_and_parse(text, TOOLS)
    assert result.calls == [] and result.normal_text == text


def test_qwen25_text_after_the_calls_stays_content() -> None:
    text = 'A<tool_call>{"name": "get_time", "arguments": {}}</tool_call> done'
    result = make_detector("qwen25").detect_and_parse(text, TOOLS)
    assert result.normal_text == "A done"
    assert [(c.name, c.parameters) for c in result.calls] == [("get_time", "{}")]


def test_json_array_under_the_constraint() -> None:
    text = f'[{{"name": "get_weather", "parameters": {js(W)}}}, {{"name": "get_time", "parameters": {{}}}}]'
    result = JsonArrayDetector().detect_and_parse(text, TOOLS)
    assert [(c.name, json.loads(c.parameters)) for c in result.calls] == [
        ("get_weather", W),
        ("get_time", {}),
    ]
    for seed in range(4):
        assert stream(JsonArrayDetector(), chunkings(text, seed))[1] == [("get_weather", W), ("get_time", {})]


def test_constraint_schema() -> None:
    required = tool_call_schema(TOOLS, "required", None)
    assert required["minItems"] == 1 and "maxItems" not in required
    assert [c["properties"]["name"]["enum"] for c in required["items"]["anyOf"]] == [
        ["get_weather"],
        ["get_time"],
    ]
    assert tool_call_schema(TOOLS, "required", False)["maxItems"] == 1
    named = tool_call_schema(TOOLS, {"type": "function", "function": {"name": "get_time"}}, True)
    assert named["maxItems"] == 1 and named["items"]["properties"]["name"]["enum"] == ["get_time"]
    assert named["items"]["properties"]["parameters"] == {"type": "object"}
