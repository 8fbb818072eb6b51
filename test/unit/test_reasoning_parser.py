"""Each `--reasoning-parser` on canned outputs: whole and streamed in random chunkings, with and
without `stream_reasoning`, and the chat-template switches that turn reasoning off."""

from __future__ import annotations

import random

import pytest

from sglang.srt.reasoning_parser import make_reasoning_detector, reasoning_parser_names

OPEN = "<think>\nThe user greets me. 2 < 3 and </ is not an end.\n</think>\n\nHello! How can I help?"
FORCED = "The user greets me. 2 < 3 and </ is not an end.\n</think>\n\nHello! How can I help?"
REASONING = "The user greets me. 2 < 3 and </ is not an end."
ANSWER = "Hello! How can I help?"


def chunkings(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(text):
        n = rng.choice([1, 2, 3, 4, 7, 11])
        pieces.append(text[i : i + n])
        i += n
    return pieces


def stream(detector, pieces):
    reasoning, normal, deltas = "", "", []
    for piece in pieces:
        out = detector.parse_streaming_increment(piece)
        reasoning += out.reasoning_text
        normal += out.normal_text
        deltas.append(out)
    last = detector.flush()
    return reasoning + last.reasoning_text, normal + last.normal_text, deltas


def test_names() -> None:
    assert {"deepseek-r1", "deepseek-v3", "qwen3", "qwen3-thinking"} <= set(reasoning_parser_names())
    with pytest.raises(ValueError, match="qwen3"):
        make_reasoning_detector("nope")


@pytest.mark.parametrize(
    "parser, text, kwargs",
    [
        ("qwen3", OPEN, None),
        ("deepseek-r1", FORCED, None),
        ("deepseek-r1", OPEN, None),  # the model repeats the template's <think>
        ("qwen3-thinking", FORCED, None),
        ("deepseek-v3", FORCED, {"thinking": True}),
    ],
)
@pytest.mark.parametrize("seed", range(6))
def test_reasoning_split_whole_and_streamed(parser, text, kwargs, seed) -> None:
    detector = make_reasoning_detector(parser, chat_template_kwargs=kwargs)
    whole = detector.detect_and_parse(text)
    assert (whole.reasoning_text, whole.normal_text) == (REASONING, ANSWER)
    reasoning, normal, deltas = stream(make_reasoning_detector(parser, True, kwargs), chunkings(text, seed))
    assert (reasoning.strip(), normal) == (REASONING, ANSWER)
    assert sum(1 for d in deltas if d.reasoning_text) > 1  # the reasoning streams in pieces


@pytest.mark.parametrize("seed", range(4))
def test_stream_reasoning_off_sends_the_reasoning_once(seed) -> None:
    reasoning, normal, deltas = stream(make_reasoning_detector("qwen3", False), chunkings(OPEN, seed))
    pieces = [d.reasoning_text for d in deltas if d.reasoning_text]
    assert len(pieces) == 1 and pieces[0].strip() == REASONING
    assert normal == ANSWER and reasoning.strip() == REASONING


def test_without_a_reasoning_section() -> None:
    text = "Hello there, no thinking <b>here</b>."
    assert make_reasoning_detector("qwen3").detect_and_parse(text).normal_text == text
    assert stream(make_reasoning_detector("qwen3"), chunkings(text, 0))[:2] == ("", text)
    # a forced family with an unfinished section (cut by max_tokens): all reasoning
    cut = make_reasoning_detector("deepseek-r1").detect_and_parse("Let me think about")
    assert (cut.reasoning_text, cut.normal_text) == ("Let me think about", "")
    assert stream(make_reasoning_detector("deepseek-r1"), ["Let me", " think"])[:2] == ("Let me think", "")


def test_template_switches_turn_reasoning_off() -> None:
    assert make_reasoning_detector("qwen3", chat_template_kwargs={"enable_thinking": False}) is None
    assert make_reasoning_detector("qwen3", chat_template_kwargs={"enable_thinking": True}) is not None
    assert make_reasoning_detector("qwen3") is not None
    assert make_reasoning_detector("deepseek-v3") is None
    assert make_reasoning_detector("deepseek-v3", chat_template_kwargs={"thinking": True}) is not None
    assert make_reasoning_detector("deepseek-r1", chat_template_kwargs={"enable_thinking": False}) is not None
