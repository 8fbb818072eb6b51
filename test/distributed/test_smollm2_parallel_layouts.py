"""Prompt logprobs and structured outputs on the parallel layouts, one engine per layout (SmolLM2
weights, float32, chunks of 8 tokens): tp 3 (9 heads over 3 ranks: the LM head's vocab shards
gathered; every rank's mirrored scheduler builds the same grammar mask), pp 2 (the last stage
computes the logprobs, which travel back in the ring's StageOutput; stage 0 builds the mask and
the last stage samples under it), cp 2 (each rank holds part of the tokens; the rows are gathered
before the LM head) and dp-attention 2 (tp 2 split into two attention replicas: each replica's
rows in the lockstep `num_logit_rows` path, each replica's grammar for its own requests).

Prompt logprobs: `logprob_start_len` 0, 1 and len-2 against transformers within 2e-3, after a
radix hit (the cached prefix is recomputed where logprobs are asked for). Structured outputs: the
same constrained greedy requests (a JSON schema, a regex) give the single rank's tokens."""

from __future__ import annotations

import json
import re
from typing import Iterator

import pytest

import sglang as sgl
from sglang.test import prompt_logprobs_reference as plr

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

LAYOUTS = {
    "tp3": dict(tp_size=3),
    "pp2": dict(pp_size=2),
    "cp2": dict(cp_size=2),
    "dp2-attention": dict(tp_size=2, dp_size=2, enable_dp_attention=True),
}
ENGINE = dict(
    dtype="float32", chunked_prefill_size=8, max_total_tokens=2048, num_threads=1, log_level="warning"
)
TOKEN_IDS = [11, 504]
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


def _engine(**layout) -> sgl.Engine:
    return sgl.Engine(model_path=plr.smollm2_hf_dir(), **ENGINE, **layout)


@pytest.fixture(scope="module")
def ref():
    prompt = list(plr.prompt_ids())
    return prompt, plr.reference(prompt)


@pytest.fixture(scope="module")
def single_constrained() -> list[list[int]]:
    with _engine() as llm:
        outs = llm.generate(PROMPTS, PARAMS)
    assert re.fullmatch(REGEX, outs[1]["text"]), outs[1]["text"]
    assert outs[0]["text"].startswith("{")
    return [o["output_ids"] for o in outs]


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout_engine(request) -> Iterator[tuple[str, sgl.Engine]]:
    with _engine(**LAYOUTS[request.param]) as llm:
        yield request.param, llm


def test_prompt_logprobs_on_parallel_layouts(ref, layout_engine):
    layout, llm = layout_engine
    prompt, lsm = ref
    n = len(prompt)
    starts = [0, 1, n - 2]
    # cached (twice: under DP attention each replica, served round robin, caches it once)
    llm.generate(input_ids=[prompt] * 2, sampling_params={"max_new_tokens": 1, "temperature": 0})
    outs = llm.generate(
        input_ids=[prompt] * 3,
        sampling_params=[{"max_new_tokens": 1 if s == 0 else 0, "temperature": 0} for s in starts],
        return_logprob=True,
        top_logprobs_num=2,
        logprob_start_len=starts,
        token_ids_logprob=TOKEN_IDS,
    )
    for out, start in zip(outs, starts):
        meta, what = out["meta_info"], f"{layout} start {start}"
        plr.check_entries(meta["input_token_logprobs"], prompt, start, lsm, what)
        plr.check_top(meta["input_top_logprobs"], start, lsm, 2, what)
        plr.check_token_ids(meta["input_token_ids_logprobs"], start, lsm, TOKEN_IDS, what)
        assert meta["cached_tokens"] <= max(start - 1, 0), what
    assert outs[2]["meta_info"]["cached_tokens"] > 0  # the prefix before len-2 came from the cache
    want_lp, want_id = plr.output_logprob(lsm)
    assert outs[0]["output_ids"] == [want_id]
    assert abs(outs[0]["meta_info"]["output_token_logprobs"][0][0] - want_lp) <= plr.TOL


def test_constrained_tokens_equal_single_rank(single_constrained, layout_engine):
    layout, llm = layout_engine
    got = [o["output_ids"] for o in llm.generate(PROMPTS, PARAMS)]
    assert got == single_constrained, layout
