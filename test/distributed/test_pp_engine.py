"""`sgl.Engine(pp_size=2)`: the launcher starts one process per stage, stage 0 schedules and the
last stage samples; greedy tokens and logprobs match one in-process scheduler (float32).
Also: a radix-cache hit, a stream closed mid-decode (abort) whose KV comes back, the per-stage
bubble ratio in the server info, and the clear errors for a bad layer partition.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

import sglang as sgl
from sglang.test.pp_harness import req, run_single_rank
from sglang.test.tiny_models import TINY_LLAMA_DIR, write_random_checkpoint

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

NEW_TOKENS = 16
TOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return str(write_random_checkpoint(TINY_LLAMA_DIR, tmp_path_factory.mktemp("pp-engine"), seed=11))


def _prompts(path: str) -> list[list[int]]:
    vocab = json.load(open(os.path.join(path, "config.json")))["vocab_size"]
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (7, 19, 45)]


def test_engine_pp2_matches_single_rank(checkpoint):
    prompts = _prompts(checkpoint)
    common = dict(model_path=checkpoint, dtype="float32", chunked_prefill_size=16, max_total_tokens=4096)
    waves = [
        [req(f"r{i}", p, NEW_TOKENS) for i, p in enumerate(prompts)],
        [req("again", prompts[2], NEW_TOKENS)],
    ]
    ref = run_single_rank({**common, "num_threads": 1}, waves)["outputs"]

    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    with sgl.Engine(**common, pp_size=2, log_level="warning") as llm:
        first = llm.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        again = llm.generate(input_ids=prompts[2], sampling_params=params, return_logprob=True)
        # a stream closed after two chunks aborts its request, wherever it is in the ring
        stream = llm.generate(
            input_ids=prompts[1], sampling_params={**params, "max_new_tokens": 2000}, stream=True
        )
        next(stream), next(stream)
        stream.close()
        deadline = time.monotonic() + 20
        while True:
            info = llm.get_server_info()
            state = info["internal_states"][0]
            if state["num_running_reqs"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)

    for rid, got in zip(["r0", "r1", "r2", "again"], first + [again]):
        assert got["output_ids"] == ref[rid].output_ids, rid
        lps = [e[0] for e in got["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(lps, ref[rid].logprobs)) <= TOL, rid
    assert again["meta_info"]["cached_tokens"] == len(prompts[2]) - 1
    assert state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
    assert len(state["pp_bubble_ratio"]) == 2 and all(0.0 <= b <= 1.0 for b in state["pp_bubble_ratio"])
    assert info["pp_size"] == 2


def test_bad_partitions_fail_before_start(checkpoint, monkeypatch):
    with pytest.raises(ValueError, match=r"--pp-size 5 is larger than the model's number of layers \(4\)"):
        sgl.Engine(model_path=checkpoint, pp_size=5)
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "1,1,1")
    with pytest.raises(
        ValueError, match=r"SGLANG_PP_LAYER_PARTITION=1,1,1 sums to 3 but the model has 4 layers"
    ):
        sgl.Engine(model_path=checkpoint, pp_size=3)
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "2,2")
    with pytest.raises(ValueError, match=r"has 2 entries but --pp-size is 3"):
        sgl.Engine(model_path=checkpoint, pp_size=3)
