"""/v1/chat/completions' tool and reasoning fields without a server: the checks (400 naming the
field), what reaches the template and the sampling params, and the message / stream deltas a
choice's text becomes; the /parse_function_call and /separate_reasoning routes in-process."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sglang.srt.entrypoints.http.common import add_error_handlers
from sglang.srt.entrypoints.http.parsers import ParserRoutes
from sglang.srt.entrypoints.openai.chat_output import ChoiceOutput, OutputParsing
from sglang.srt.entrypoints.openai.chat_tools import (
    check_tools,
    template_tools,
    tool_mode,
    tool_sampling_params,
)
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.serving_chat import template_kwargs
from sglang.srt.entrypoints.openai.utils import OpenAIError

USER = {"role": "user", "content": "weather?"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]
NAMED = {"type": "function", "function": {"name": "get_time"}}
OUTPUT = (
    "<think>\nThe user wants the weather.\n</think>\n\nChecking.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [USER], **fields})


def parsing(req: ChatCompletionRequest, reasoning="qwen3", tools="qwen25") -> OutputParsing:
    return OutputParsing.of(req, reasoning, tools, template_kwargs(req))


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"tools": [{"type": "retrieval"}]}, "tools", "tools[0]"),
        ({"tools": [{"type": "function"}]}, "tools", "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "tools[0].function.name"),
        ({"tools": [{"function": {"name": "f", "parameters": [1]}}]}, "tools", "parameters"),
        ({"tools": TOOLS + TOOLS[:1]}, "tools", "twice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "sometimes"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "nope",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice", "named"),
        ({"tool_choice": "required"}, "tool_choice", "required"),
    ],
)
def test_bad_tools_are_refused_naming_the_field(fields, param, words) -> None:
    with pytest.raises(OpenAIError) as err:
        check_tools(chat(**fields))
    assert err.value.param == param and words in err.value.message and err.value.status == 400


def test_modes_template_tools_and_constraint() -> None:
    assert tool_mode(chat()) == "none" and template_tools(chat()) is None
    assert tool_mode(chat(tools=TOOLS, tool_choice="none")) == "none"
    assert template_tools(chat(tools=TOOLS, tool_choice="none")) is None
    assert tool_mode(chat(tools=TOOLS)) == "auto" and tool_sampling_params(chat(tools=TOOLS)) == {}
    assert template_tools(chat(tools=[{"function": {"name": "f"}}])) == [
        {"type": "function", "function": {"name": "f"}}
    ]
    for choice in ("required", NAMED):
        req = chat(tools=TOOLS, tool_choice=choice)
        assert tool_mode(req) == "forced"
        schema = json.loads(tool_sampling_params(req)["json_schema"])
        assert schema["type"] == "array" and schema["minItems"] == 1
    named = json.loads(tool_sampling_params(chat(tools=TOOLS, tool_choice=NAMED))["json_schema"])
    assert named["items"]["properties"]["name"]["enum"] == ["get_time"] and named["maxItems"] == 1


def test_message_with_reasoning_content_and_calls() -> None:
    output = ChoiceOutput(parsing(chat(tools=TOOLS)))
    msg = output.message(OUTPUT)
    assert msg.reasoning_content == "The user wants the weather."
    assert msg.content == "Checking.\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
    ]
    assert all(c.id.startswith("call_") and c.type == "function" for c in msg.tool_calls)
    assert output.made_calls
    single = ChoiceOutput(parsing(chat(tools=TOOLS, parallel_tool_calls=False))).message(OUTPUT)
    assert [c.function.name for c in single.tool_calls] == ["get_weather"]


def test_switches_turn_parsing_off() -> None:
    # no tools (or tool_choice none): the calls stay text; separate_reasoning false: the think too
    assert ChoiceOutput(parsing(chat())).message(OUTPUT).tool_calls is None
    assert ChoiceOutput(parsing(chat(tools=TOOLS, tool_choice="none"))).message(OUTPUT).tool_calls is None
    whole = ChoiceOutput(parsing(chat(separate_reasoning=False), tools=None)).message(OUTPUT)
    assert whole.content == OUTPUT and whole.reasoning_content is None
    off = chat(chat_template_kwargs={"enable_thinking": False})
    assert ChoiceOutput(parsing(off, tools=None)).message("<think>x</think>y").content == "<think>x</think>y"
    assert ChoiceOutput(parsing(chat(reasoning_effort="none"), tools=None)).reasoning is None
    # without --tool-call-parser, "auto" leaves the text as content
    assert ChoiceOutput(parsing(chat(tools=TOOLS), tools=None)).message(OUTPUT).tool_calls is None


def test_forced_choice_parses_the_json_array() -> None:
    req = chat(tools=TOOLS, tool_choice=NAMED)
    msg = ChoiceOutput(parsing(req, reasoning=None, tools=None)).message(
        '[{"name": "get_time", "parameters": {}}]'
    )
    assert msg.content is None and [c.function.name for c in msg.tool_calls] == ["get_time"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_stream_deltas_reassemble(seed: int, stream_reasoning: bool) -> None:
    output = ChoiceOutput(parsing(chat(tools=TOOLS, stream_reasoning=stream_reasoning)))
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(OUTPUT):
        n = rng.randint(1, 9)
        pieces.append(OUTPUT[i : i + n])
        i += n
    reasoning, content, calls, reasoning_deltas = "", "", {}, 0
    for piece in pieces + [None]:
        text, call_deltas = output.deltas(piece) if piece is not None else (output.finish(), [])
        reasoning += text.reasoning_content or ""
        reasoning_deltas += bool(text.reasoning_content)
        content += text.content or ""
        for delta in call_deltas:
            (call,) = delta.tool_calls
            if call.id is not None:
                assert call.type == "function" and call.function.name and call.index not in calls
                calls[call.index] = [call.id, call.function.name, ""]
            else:
                assert call.function.name is None and call.id is None
                calls[call.index][2] += call.function.arguments
    assert reasoning.strip() == "The user wants the weather." and content == "Checking.\n"
    assert (reasoning_deltas > 1) == stream_reasoning
    assert [(c[1], json.loads(c[2])) for c in calls.values()] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
    ]
    assert output.made_calls


def test_parse_routes_in_process() -> None:
    app = FastAPI()
    add_error_handlers(app)
    app.include_router(
        ParserRoutes(SimpleNamespace(tool_call_parser="qwen25", reasoning_parser=None)).router()
    )
    client = TestClient(app)
    text = 'Hi <tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>'
    r = client.post("/parse_function_call", json={"text": text, "tools": TOOLS})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "normal_text": "Hi ",
        "calls": [{"tool_index": 0, "name": "get_time", "parameters": '{"zone": "CET"}'}],
    }
    r = client.post("/parse_function_call", json={"text": text, "tools": TOOLS, "tool_call_parser": "nope"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_call_parser" and "qwen25" in r.text
    r = client.post("/parse_function_call", json={"text": text, "tools": [{"function": {}}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    r = client.post("/separate_reasoning", json={"text": "<think>a</think>b"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_parser"
    r = client.post("/separate_reasoning", json={"text": "a</think>b", "reasoning_parser": "deepseek-r1"})
    assert r.json() == {"text": "b", "reasoning_text": "a"}


@pytest.mark.parametrize(
    "flag, names",
    [("--tool-call-parser", "'llama3', 'mistral'"), ("--reasoning-parser", "'qwen3', 'qwen3-thinking'")],
)
def test_unknown_parser_is_refused_at_start_up(flag: str, names: str, capsys) -> None:
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    from sglang.test.tiny_models import TINY_LLAMA_DIR

    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", TINY_LLAMA_DIR, "--device", "cpu", flag, "nope"])
    err = capsys.readouterr().err
    assert f"argument {flag}: invalid choice: 'nope'" in err and names in err
    field = flag[2:].replace("-", "_")
    with pytest.raises(ValueError, match=f"{flag} must be one of .*got 'nope'"):
        ServerArgs(model_path=TINY_LLAMA_DIR, device="cpu", **{field: "nope"}).validate()
    ok = prepare_server_args(
        [
            "--model-path",
            TINY_LLAMA_DIR,
            "--device",
            "cpu",
            flag,
            "deepseek-r1" if "reasoning" in flag else "qwen25",
        ]
    )
    assert getattr(ok, field) in ("deepseek-r1", "qwen25")
