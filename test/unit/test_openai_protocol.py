"""OpenAI protocol models and conversions (no server): request parsing, sampling-parameter mapping,
model-name checks, finish reasons, usage and logprob formats, error shape, SSE framing."""

from __future__ import annotations

import json

import pytest

from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from sglang.srt.entrypoints.openai.serving_chat import chat_logprobs, message_dicts
from sglang.srt.entrypoints.openai.serving_completions import completion_logprobs
from sglang.srt.entrypoints.openai.utils import (
    OpenAIError,
    check_constrained_decoding,
    check_model_name,
    error_body,
    finish_reason_of,
    make_usage,
    parse_model,
    sse,
)
from sglang.srt.sampling.sampling_params import SamplingParams


def test_completion_prompt_shapes():
    assert parse_model(CompletionRequest, {"prompt": "hi"}).prompt == "hi"
    assert parse_model(CompletionRequest, {"prompt": ["a", "b"]}).prompt == ["a", "b"]
    assert parse_model(CompletionRequest, {"prompt": [1, 2]}).prompt == [1, 2]
    assert parse_model(CompletionRequest, {"prompt": [[1], [2, 3]]}).prompt == [[1], [2, 3]]
    assert parse_model(CompletionRequest, {"prompt": "hi"}).max_tokens == 16  # OpenAI's default


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": 5},
        {"prompt": "hi", "max_tokens": "many"},
        {"prompt": "hi", "temperature": "hot"},
        {"prompt": "hi", "stop": 3},
        {},
        [1, 2],
    ],
)
def test_bad_completion_bodies_raise_400(body):
    with pytest.raises(OpenAIError) as info:
        parse_model(CompletionRequest, body)
    assert info.value.status == 400


def test_sampling_params_mapping_is_accepted_by_sampling_params():
    req = parse_model(
        CompletionRequest,
        {
            "prompt": "hi",
            "max_tokens": 7,
            "min_tokens": 2,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 5,
            "min_p": 0.1,
            "seed": 3,
            "stop": ["x"],
            "frequency_penalty": 0.5,
            "presence_penalty": 0.2,
            "repetition_penalty": 1.1,
            "n": 2,
            "ignore_eos": True,
            "user": "someone",
        },
    )
    params = req.base_sampling_params(req.max_tokens)
    assert params["max_new_tokens"] == 7 and params["min_new_tokens"] == 2 and params["seed"] == 3
    sp = SamplingParams.from_dict(params)
    sp.verify(1000)
    assert sp.n == 2 and sp.top_k == 5 and sp.stop == ["x"] and sp.ignore_eos


def test_unset_fields_keep_sampling_defaults():
    req = parse_model(ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}]})
    params = req.base_sampling_params(None)
    assert "max_new_tokens" not in params and "temperature" not in params
    assert SamplingParams.from_dict(params).temperature == SamplingParams().temperature


def test_chat_messages_with_text_parts():
    req = parse_model(
        ChatCompletionRequest,
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            ]
        },
    )
    assert message_dicts(req) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
    ]
    bad = parse_model(
        ChatCompletionRequest,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
    )
    with pytest.raises(OpenAIError):
        message_dicts(bad)
    with pytest.raises(OpenAIError):
        parse_model(ChatCompletionRequest, {"messages": [{"role": "robot", "content": "x"}]})


def test_model_name_check():
    check_model_name(None, "served", "/models/tiny")
    for ok in ("served", "/models/tiny", "tiny", "default"):
        check_model_name(ok, "served", "/models/tiny")
    with pytest.raises(OpenAIError) as info:
        check_model_name("gpt-4", "served", "/models/tiny")
    # upstream SGLang's answer: 400 naming both names
    assert (
        info.value.status == 400 and info.value.err_type == "BadRequestError" and info.value.param == "model"
    )
    assert info.value.message == "The model `gpt-4` does not exist. The served model name is `served`."


_MSG = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    "cls, extra, param, error",
    [
        (CompletionRequest, {"prompt": "x", "regex": "a("}, "regex", "invalid regex"),
        (CompletionRequest, {"prompt": "x", "json_schema": '{"type": "nope"}'}, "json_schema", "nope"),
        (CompletionRequest, {"prompt": "x", "ebnf": "root ::= foo"}, "ebnf", 'Rule "foo" is not defined'),
        (ChatCompletionRequest, {"messages": _MSG, "regex": "[a-"}, "regex", "invalid regex"),
        (ChatCompletionRequest, {"messages": _MSG, "json_schema": {"type": "nope"}}, "json_schema", "nope"),
        (ChatCompletionRequest, {"messages": _MSG, "ebnf": "root ::= foo"}, "ebnf", "invalid ebnf"),
        (
            ChatCompletionRequest,
            {
                "messages": _MSG,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                },
            },
            "response_format",
            "invalid json_schema",
        ),
        (
            ChatCompletionRequest,
            {"messages": _MSG, "response_format": {"type": "xml"}},
            "response_format",
            "xml",
        ),
        (
            ChatCompletionRequest,
            {"messages": _MSG, "regex": "a+", "response_format": {"type": "json_object"}},
            "response_format",
            "only one constraint",
        ),
    ],
)
def test_invalid_constraints_are_400_naming_the_error(cls, extra, param, error):
    req = parse_model(cls, extra)
    with pytest.raises(OpenAIError) as info:
        check_constrained_decoding(req)
    assert info.value.status == 400 and error in info.value.message
    assert info.value.param == param


@pytest.mark.parametrize(
    "cls, extra, params",
    [
        (CompletionRequest, {"prompt": "x", "regex": "a+"}, {"regex": "a+"}),
        (CompletionRequest, {"prompt": "x", "ebnf": 'root ::= "a"'}, {"ebnf": 'root ::= "a"'}),
        (
            ChatCompletionRequest,
            {"messages": _MSG, "json_schema": {"type": "object"}},
            {"json_schema": '{"type": "object"}'},
        ),
        (
            ChatCompletionRequest,
            {
                "messages": _MSG,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
            },
            {"json_schema": "{}"},
        ),
        (
            ChatCompletionRequest,
            {"messages": _MSG, "response_format": {"type": "json_object"}},
            {"json_schema": '{"type": "object"}'},
        ),
    ],
)
def test_valid_constraints_become_native_sampling_params(cls, extra, params):
    req = parse_model(cls, extra)
    check_constrained_decoding(req)
    sampling = req.base_sampling_params(4)
    assert {k: sampling[k] for k in params} == params


def test_plain_requests_pass_the_constrained_decoding_check():
    check_constrained_decoding(parse_model(CompletionRequest, {"prompt": "x", "regex": None}))
    check_constrained_decoding(
        parse_model(
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"}},
        )
    )


def test_finish_reason_mapping():
    assert finish_reason_of(None) == (None, None)
    assert finish_reason_of({"type": "stop", "matched": "###"}) == ("stop", "###")
    assert finish_reason_of({"type": "stop", "matched": 2}) == ("stop", 2)
    assert finish_reason_of({"type": "length", "length": 5}) == ("length", None)
    assert finish_reason_of({"type": "abort", "message": "x"}) == ("abort", None)


def _out(prompt, completion, cached=0):
    return {"meta_info": {"prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": cached}}


def test_usage_counts_each_prompt_once():
    usage = make_usage([_out(10, 3, 4), _out(10, 5, 4), _out(7, 2, 0), _out(7, 1, 0)], n=2)
    assert usage.prompt_tokens == 17 and usage.completion_tokens == 11 and usage.total_tokens == 28
    assert usage.prompt_tokens_details.cached_tokens == 4


def test_completion_logprobs_format():
    lps = [(-0.5, 1, "He"), (-1.0, 2, "llo")]
    tops = [[(-0.5, 1, "He"), (-0.7, 9, "\ufffd"), (-0.9, 8, "\ufffd")], [(-1.0, 2, "llo")]]
    out = completion_logprobs(lps, tops, text_offset=3)
    assert out.tokens == ["He", "llo"] and out.token_logprobs == [-0.5, -1.0]
    assert out.text_offset == [3, 5]
    assert out.top_logprobs[0] == {"He": -0.5, "\ufffd": -0.7}  # shared text keeps the likelier
    assert completion_logprobs(lps, [], 0).top_logprobs == [None, None]


def test_chat_logprobs_format():
    out = chat_logprobs([(-0.25, 5, "é")], [[(-0.25, 5, "é"), (-2.0, 6, "e")]])
    entry = out.content[0]
    assert entry.token == "é" and entry.bytes == [0xC3, 0xA9] and entry.logprob == -0.25
    assert [t.token for t in entry.top_logprobs] == ["é", "e"]


def test_error_shape_and_sse():
    body = error_body("bad thing", 400)
    assert body == {"error": {"message": "bad thing", "type": "BadRequestError", "param": None, "code": 400}}
    line = sse({"a": 1})
    assert line.startswith("data: ") and line.endswith("\n\n")
    assert json.loads(line[len("data: ") :]) == {"a": 1}
