"""Context parallelism through the whole engine (one scheduler process per rank, entry-rank
broadcast, gloo groups, sharded KV in the virtual slot space) vs cp = 1, float32.

Workload: a batch of 3 prompts of odd lengths where the 45-token one is prefilled over 3 chunks
(chunk 16) while the others decode, 32 greedy tokens each; then the long prompt again (a radix
hit). Greedy ids identical; logprob of every sampled token within 1e-4 of cp = 1. Then the
3 prompts again with seeded sampling (top-p, top-k, a frequency penalty, logit_bias; 3 top
logprobs): ids identical, logprobs and top logprobs within 1e-4 (each cp rank samples its own
rows, `layers/sampler_cp.py`). cp = 2 with
both strategies, cp = 4 (zigzag, interleave 2 with page 2), pp = 2 × cp = 2, and cp = 2 with
`--cp-min-split-tokens 12` (adaptive CP: the short prompt runs whole on every rank, counted by
`cp_unsplit_prefill_tokens`; the suite's default is 0, always split), also with
`--enable-cp-dense-tp` (embedding / LM head vocab-sharded over the cp group). The engine reports
each rank's physical KV pool and usage: a request's share is ≤ ceil(tokens / cp) + one page.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import sglang as sgl
from sglang.test.tiny_models import TINY_LLAMA_DIR, write_random_checkpoint

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

NEW_TOKENS = 32
TOL = 1e-4
MAX_TOTAL = 4096
CONFIGS = {
    "cp2-zigzag": dict(cp_size=2, cp_strategy="zigzag"),
    "cp2-round-robin": dict(cp_size=2, cp_strategy="round-robin"),
    "cp4-zigzag-i2": dict(cp_size=4, cp_strategy="zigzag", page_size=2, cp_kv_cache_interleave_size=2),
    "pp2-cp2": dict(cp_size=2, pp_size=2, cp_strategy="zigzag"),
    # adaptive CP: the 7-token prompt runs whole on both ranks; the 19-token one and the 45-token
    # one's 16-token chunks are split
    "cp2-min-split-12": dict(cp_size=2, cp_min_split_tokens=12),
    # embedding / LM head vocab-sharded over the cp group (layers/cp_dense_tp.py), with the adaptive
    # split so that both split last tokens (slices moved to their holders) and a row every rank
    # holds (slices all-gathered) reach the sharded head
    "cp2-dense-tp-min-split-12": dict(cp_size=2, cp_min_split_tokens=12, enable_cp_dense_tp=True),
}


# seeded sampling (each request's own generator): under a split CP decode every rank samples only
# its own rows (layers/sampler_cp.py), with the same tokens and logprobs as one process. Every
# request has a top-p: one process draws a row from sorted probabilities when any row of its batch
# has a top-k / top-p, else in vocabulary order, so a request's token depends on its batch partners,
# and pp 2 batches them differently from cp 1 (micro-batches)
SAMPLED = [
    {"max_new_tokens": 8, "temperature": 0.8, "top_p": 0.9, "sampling_seed": 7, "ignore_eos": True},
    {
        "max_new_tokens": 8,
        "temperature": 1.1,
        "top_k": 20,
        "top_p": 0.95,
        "frequency_penalty": 0.4,
        "sampling_seed": 8,
        "ignore_eos": True,
    },
    {
        "max_new_tokens": 8,
        "temperature": 0.7,
        "top_p": 0.95,
        "logit_bias": {"5": 3.0},
        "sampling_seed": 9,
        "ignore_eos": True,
    },
]


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (7, 19, 45)]


def _run(path: str, prompts: list[list[int]], **kwargs) -> dict:
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    with sgl.Engine(
        model_path=path,
        dtype="float32",
        chunked_prefill_size=16,
        max_total_tokens=MAX_TOTAL,
        num_threads=1,
        log_level="warning",
        **kwargs,
    ) as llm:
        first = llm.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        again = llm.generate(input_ids=prompts[2], sampling_params=params, return_logprob=True)
        state_after_hit = llm.get_server_info()["internal_states"][0]
        sampled = llm.generate(
            input_ids=prompts, sampling_params=SAMPLED, return_logprob=True, top_logprobs_num=3
        )
        llm.flush_cache()
        one = llm.generate(input_ids=prompts[2], sampling_params={**params, "max_new_tokens": 1})
        state_one = llm.get_server_info()["internal_states"][0]
    return {
        "outs": first + [again],
        "sampled": sampled,
        "state": state_after_hit,
        "state_one": state_one,
        "one": one,
    }


@pytest.fixture(scope="module")
def model_and_reference(tmp_path_factory):
    path = str(write_random_checkpoint(TINY_LLAMA_DIR, tmp_path_factory.mktemp("cp_llama"), seed=11))
    vocab = json.load(open(os.path.join(path, "config.json")))["vocab_size"]
    prompts = _prompts(vocab)
    return path, prompts, _run(path, prompts)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cp_engine_matches_single_rank(model_and_reference, name):
    path, prompts, ref = model_and_reference
    cfg = CONFIGS[name]
    got = _run(path, prompts, **cfg)
    for r, g in zip(ref["outs"], got["outs"]):
        assert g["output_ids"] == r["output_ids"], name
        ref_lp = [e[0] for e in r["meta_info"]["output_token_logprobs"]]
        got_lp = [e[0] for e in g["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(ref_lp, got_lp)) <= TOL, name
    for r, g in zip(ref["sampled"], got["sampled"]):  # seeded sampling, logprobs and top logprobs
        assert g["output_ids"] == r["output_ids"], name
        ref_m, got_m = r["meta_info"], g["meta_info"]
        pairs = [(a[0], b[0]) for a, b in zip(ref_m["output_token_logprobs"], got_m["output_token_logprobs"])]
        for ref_top, got_top in zip(ref_m["output_top_logprobs"], got_m["output_top_logprobs"]):
            assert len(got_top) == len(ref_top) == 3, name
            pairs += [(a[0], b[0]) for a, b in zip(ref_top, got_top)]
        assert len(pairs) == 8 * 4 and max(abs(a - b) for a, b in pairs) <= TOL, name
    cp, page = cfg["cp_size"], cfg.get("page_size", 1)
    # radix hit, in whole virtual pages (page · cp)
    assert got["outs"][-1]["meta_info"]["cached_tokens"] == (len(prompts[2]) - 1) // (page * cp) * (page * cp)
    state = got["state_one"]
    assert state["cp_size"] == cp
    # sharded KV: each rank's pool holds 1/cp of the (virtual) capacity, which grows with cp
    assert state["kv_physical_tokens_per_rank"] * cp == state["max_total_num_tokens"]
    # one finished 46-token request left in the radix cache: its share per rank
    tokens = len(prompts[2]) + 1
    assert 0 < state["kv_physical_used_per_rank"] <= -(-tokens // cp) + page
    min_split = cfg.get("cp_min_split_tokens", 0)
    unsplit = state["cp_unsplit_prefill_tokens"]
    if min_split == 0:
        assert unsplit == 0
    else:  # the 7-token prompt whole, plus first chunks under 12 tokens where the 16-token budget
        # cut a prompt after the one before it; the 45-token prompt's chunk over its prefix never
        assert sum(len(p) for p in prompts if len(p) < min_split) <= unsplit < sum(map(len, prompts)), unsplit
