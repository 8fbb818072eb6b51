"""Jump-forward (`--enable-jump-forward`) on the parallel layouts (SmolLM2, float32, chunks of 8
tokens): tp 3 (mirrored schedulers retokenize and extend alike), pp 2 (stage 0's scheduler jumps;
the appended tokens travel as an extend micro-batch), cp 2 (the extend's tokens split over the
ranks' KV) and dp-attention 2 (each replica jumps for its own requests). Constrained greedy
requests with long fixed keys give the single rank's tokens (jump-forward on there too), and the
forced keys were jumped (`jump_forward_tokens`)."""

from __future__ import annotations

import json
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
    dtype="float32",
    chunked_prefill_size=8,
    max_total_tokens=2048,
    num_threads=1,
    log_level="warning",
    enable_jump_forward=True,
)
KEYS = ("customer_full_name", "customer_account_identifier", "customer_membership_level")
SCHEMA = {
    "type": "object",
    "properties": {
        KEYS[0]: {"type": "string", "maxLength": 12},
        KEYS[1]: {"type": "integer", "minimum": 0, "maximum": 999},
        KEYS[2]: {"enum": ["bronze_member_level", "silver_member_level", "golden_member_level"]},
    },
    "required": list(KEYS),
    "additionalProperties": False,
}
PROMPTS = [
    "<|im_start|>user\nDescribe a customer as JSON.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nA person as JSON.<|im_end|>\n<|im_start|>assistant\n",
]
PARAMS = {"max_new_tokens": 48, "temperature": 0, "json_schema": json.dumps(SCHEMA)}


def _run(**layout) -> tuple[list[list[int]], int]:
    with sgl.Engine(model_path=plr.smollm2_hf_dir(), **ENGINE, **layout) as llm:
        outs = llm.generate(PROMPTS, PARAMS)
        states = llm.get_server_info()["internal_states"]
    for out in outs:
        assert list(json.loads(out["text"])) == list(KEYS), out["text"]
    return [o["output_ids"] for o in outs], sum(s["jump_forward_tokens"] for s in states)


@pytest.fixture(scope="module")
def single() -> list[list[int]]:
    ids, jumped = _run()
    assert jumped >= len(PROMPTS) * 3 * 4  # the keys' tokens
    return ids


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request) -> Iterator[str]:
    yield request.param


def test_jump_forward_tokens_equal_single_rank(single, layout):
    ids, jumped = _run(**LAYOUTS[layout])
    assert ids == single, layout
    assert jumped > 0, layout
