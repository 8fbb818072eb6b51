"""Structured outputs on the parallel layouts (SmolLM2 weights, float32): the same constrained greedy
requests (a JSON schema, a regex) give the single rank's tokens at tp 3 (9 heads over 3 ranks, every
rank's mirrored scheduler builds the same mask), pp 2 (stage 0 builds the mask, the last stage
samples under it), cp 2 and dp-attention 2 (each replica for its own requests)."""

from __future__ import annotations

import json
import re

import pytest

import sglang as sgl
from sglang.test.prompt_logprobs_reference import smollm2_hf_dir

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

LAYOUTS = {
    "tp3": dict(tp_size=3),
    "pp2": dict(pp_size=2),
    "cp2": dict(cp_size=2),
    "dp2-attention": dict(tp_size=2, dp_size=2, enable_dp_attention=True),
}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
REGEX = r"(yes|no), [0-9]{2}"
PROMPTS = [
    "<|im_start|>user\nA person as JSON.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nDo you like tea? How old are you?<|im_end|>\n<|im_start|>assistant\n",
]
PARAMS = [
    {"max_new_tokens": 20, "temperature": 0, "json_schema": json.dumps(SCHEMA)},
    {"max_new_tokens": 12, "temperature": 0, "regex": REGEX},
]
ENGINE = dict(dtype="float32", max_total_tokens=2048, num_threads=1, log_level="warning")


def run(**layout) -> list[dict]:
    with sgl.Engine(model_path=smollm2_hf_dir(), **ENGINE, **layout) as llm:
        return llm.generate(PROMPTS, PARAMS)


@pytest.fixture(scope="module")
def single():
    outs = run()
    assert re.fullmatch(REGEX, outs[1]["text"]), outs[1]["text"]
    assert outs[0]["text"].startswith("{")
    return [o["output_ids"] for o in outs]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_constrained_tokens_equal_single_rank(single, layout):
    got = [o["output_ids"] for o in run(**LAYOUTS[layout])]
    assert got == single, layout
