"""Tensor parallelism through the whole engine (launcher, one scheduler process per rank, entry-rank
broadcast, gloo groups): tp=2 and tp=4 vs tp=1 on a random tiny checkpoint, float32.

Workload: a batch of prompts of different lengths, one longer than the chunk (chunked prefill while
the others decode), then a radix-cache hit. Greedy ids must be identical; the logprob of every
sampled token (log-softmax of the logits) within 1e-4 of tp=1.
"""

from __future__ import annotations

import pytest
import torch

import sglang as sgl
from sglang.test.tiny_models import TINY_LLAMA_DIR, TINY_QWEN3_DIR, write_random_checkpoint

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

NEW_TOKENS = 32
TOL = 1e-4


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (7, 19, 45)]


def _run(path: str, tp: int, prompts: list[list[int]]) -> list[dict]:
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    with sgl.Engine(
        model_path=path,
        dtype="float32",
        tp_size=tp,
        chunked_prefill_size=16,
        max_total_tokens=4096,
        num_threads=1,
        log_level="warning",
    ) as llm:
        first = llm.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        again = llm.generate(input_ids=prompts[2], sampling_params=params, return_logprob=True)
    return first + [again]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model_and_reference(request, tmp_path_factory):
    src = TINY_LLAMA_DIR if request.param == "llama" else TINY_QWEN3_DIR
    path = str(write_random_checkpoint(src, tmp_path_factory.mktemp(request.param), seed=11))
    import json, os

    vocab = json.load(open(os.path.join(path, "config.json")))["vocab_size"]
    prompts = _prompts(vocab)
    return path, prompts, _run(path, 1, prompts)


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_matches_single_rank(model_and_reference, tp):
    path, prompts, ref = model_and_reference
    got = _run(path, tp, prompts)
    for r, g in zip(ref, got):
        assert g["output_ids"] == r["output_ids"]
        ref_lp = [e[0] for e in r["meta_info"]["output_token_logprobs"]]
        got_lp = [e[0] for e in g["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(ref_lp, got_lp)) <= TOL
    assert got[-1]["meta_info"]["cached_tokens"] == len(prompts[2]) - 1
