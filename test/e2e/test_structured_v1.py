"""Structural tags through /v1 end to end (issue 29) on a real server (SmolLM2, xgrammar):
`response_format: {"type": "structural_tag", ...}` constrains the chat answer, the tagged section
parses against its schema; a malformed structural tag is a 400 on the `response_format` field and
the server keeps serving."""

from __future__ import annotations

import json
import re

import openai
import pytest
from server_helpers import launch_server

from sglang.srt.model_loader.default_model import find_default_model

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
TAGGED = re.compile(r"<city>(.*?)</city>", re.S)


@pytest.fixture(scope="module")
def oai():
    handle = launch_server(("--load-format", "auto", "--num-threads", "1"), model=find_default_model())
    yield openai.OpenAI(base_url=handle.url + "/v1", api_key="none", max_retries=0, timeout=300)
    handle.stop()


def chat(oai, content: str, fmt: dict, **extra):
    return oai.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": content}],
        max_tokens=40,
        temperature=0,
        response_format=fmt,
        **extra,
    )


def check_sections(text: str, at_least: int) -> None:
    sections = TAGGED.findall(text)
    assert len(sections) >= at_least, text
    for section in sections:
        obj = json.loads(section)
        assert set(obj) == {"city"} and isinstance(obj["city"], str) and len(obj["city"]) <= 12, text


def test_structural_tag_sections_parse(oai):
    # xgrammar's form: the tag is the whole answer
    forced = {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": "<city>",
            "content": {"type": "json_schema", "json_schema": CITY},
            "end": "</city>",
        },
    }
    r = chat(oai, "Name a city.", forced)
    assert r.choices[0].finish_reason == "stop"
    text = r.choices[0].message.content
    assert text.startswith("<city>") and text.endswith("</city>"), text
    check_sections(text, 1)
    stream = chat(oai, "Name a city.", forced, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    # upstream's form: free text, and every section a trigger opens follows its schema
    upstream = {
        "type": "structural_tag",
        "structures": [{"begin": "<city>", "schema": CITY, "end": "</city>"}],
        "triggers": ["<city>"],
    }
    r = chat(oai, 'Write <city>{"city": "Paris"}</city> and one more city in the same form.', upstream)
    check_sections(r.choices[0].message.content, 0)


def test_malformed_structural_tag_is_400_naming_the_field(oai):
    bad = {
        "type": "structural_tag",
        "structures": [{"schema": CITY, "end": "</city>"}],
        "triggers": ["<city>"],
    }
    with pytest.raises(openai.BadRequestError) as info:
        chat(oai, "x", bad)
    assert info.value.body["param"] == "response_format"
    assert "structures[0] needs a string 'begin'" in info.value.body["message"]
    bad = {
        "type": "structural_tag",
        "structures": [{**bad["structures"][0], "begin": "<city>", "schema": {"type": "nope"}}],
        "triggers": ["<city>"],
    }
    with pytest.raises(openai.BadRequestError) as info:
        chat(oai, "x", bad)
    assert info.value.body["param"] == "response_format" and "nope" in info.value.body["message"]
    r = chat(oai, "Name a city.", {"type": "text"})
    assert r.choices[0].message.content
