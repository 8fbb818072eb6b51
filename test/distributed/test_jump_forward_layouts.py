"""Jump-forward (`--enable-jump-forward`) on the parallel layouts (SmolLM2, float32, chunks of 8
tokens): tp 3 (mirrored schedulers retokenize and extend alike), pp 2 (stage 0's scheduler jumps;
the appended tokens travel as an extend micro-batch), cp 2 (the extend's tokens split over the
ranks' KV) and dp-attention 2 (each replica jumps for its own requests). Constrained greedy
requests with long fixed keys give the single rank's tokens (jump-forward on there too), and the
forced keys were jumped (`jump_forward_tokens`)."""

from __future__ import annotations

from typing import Iterator

import pytest
from test_smollm2_parallel_layouts import ENGINE as BASE_ENGINE
from test_smollm2_parallel_layouts import LAYOUTS

import sglang as sgl
from sglang.test import prompt_logprobs_reference as plr
from sglang.test.long_key_schema import SCHEMA_TEXT, check

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

ENGINE = dict(BASE_ENGINE, enable_jump_forward=True)
PROMPTS = [
    "<|im_start|>user\nDescribe a customer as JSON.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nA person as JSON.<|im_end|>\n<|im_start|>assistant\n",
]
PARAMS = {"max_new_tokens": 48, "temperature": 0, "json_schema": SCHEMA_TEXT}


def _run(**layout) -> tuple[list[list[int]], int]:
    with sgl.Engine(model_path=plr.smollm2_hf_dir(), **ENGINE, **layout) as llm:
        outs = llm.generate(PROMPTS, PARAMS)
        states = llm.get_server_info()["internal_states"]
    for out in outs:
        check(out["text"])
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
