"""`response_format: {"type": "structural_tag", ...}` on /v1 (issue 29): upstream's form (structures +
triggers) and xgrammar's (`format`) become the native `structural_tag` sampling parameter; a
malformed one is a 400 on the `response_format` field naming what is wrong."""

from __future__ import annotations

import json

import pytest

from sglang.srt.constrained.grammar_spec import GrammarSpec, to_grammar
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.utils import OpenAIError, check_constrained_decoding

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
UPSTREAM = {
    "type": "structural_tag",
    "structures": [{"begin": "<city>", "schema": CITY, "end": "</city>"}],
    "triggers": ["<city>"],
}
FORMAT = {
    "type": "structural_tag",
    "format": {
        "type": "tag",
        "begin": "<n>",
        "content": {"type": "json_schema", "json_schema": {"type": "integer"}},
        "end": "</n>",
    },
}


def request(fmt: dict) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "default", "messages": [{"role": "user", "content": "x"}], "response_format": fmt}
    )


@pytest.mark.parametrize("fmt", [UPSTREAM, FORMAT])
def test_structural_tag_becomes_the_native_parameter(fmt):
    req = request(fmt)
    check_constrained_decoding(req)
    params = req.base_sampling_params(8)
    assert json.loads(params["structural_tag"]) == fmt
    to_grammar(GrammarSpec("structural_tag", params["structural_tag"]))


def _without(key: str) -> dict:
    structure = {k: v for k, v in UPSTREAM["structures"][0].items() if k != key}
    return {**UPSTREAM, "structures": [structure]}


@pytest.mark.parametrize(
    "fmt, error",
    [
        (_without("begin"), "structures[0] needs a string 'begin'"),
        (_without("end"), "structures[0] needs a string 'end'"),
        ({**UPSTREAM, "triggers": []}, "'triggers' must be a non-empty list"),
        ({**UPSTREAM, "structures": []}, "'structures' must be a non-empty list"),
        ({**UPSTREAM, "structures": ["<city>"]}, "structures[0] must be an object"),
        ({**UPSTREAM, "triggers": ["<town>"]}, "starts with no trigger"),
        (
            {**_without("schema"), "structures": [{**UPSTREAM["structures"][0], "schema": "x"}]},
            "'schema' must",
        ),
        ({**UPSTREAM, "structures": [{**UPSTREAM["structures"][0], "schema": {"type": "nope"}}]}, "nope"),
        ({"type": "structural_tag"}, "invalid structural_tag"),
        ({"type": "structural_tag", "format": {"type": "tag", "begin": "<a>"}}, "invalid structural_tag"),
    ],
)
def test_malformed_structural_tag_is_400_on_response_format(fmt, error):
    with pytest.raises(OpenAIError) as info:
        check_constrained_decoding(request(fmt))
    assert info.value.status == 400 and error in info.value.message, info.value.message
    assert info.value.param == "response_format"
