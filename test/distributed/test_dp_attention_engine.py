"""DP attention through the whole engine (data-parallel controller, one scheduler per attention-DP
replica, lockstep forwards with IDLE batches) vs the in-process single-rank scheduler, float32.

Dense: the embedded SmolLM2-135M GGUF with `--tp-size 2 --dp-size 2 --enable-dp-attention` (dense
MLPs and LM head over both replicas) and with `--moe-dense-tp-size 1` (dense MLPs replicated).
Workload: 3 ragged prompts (the 45-token one prefilled in chunks of 32 while the others decode)
that stop after different numbers of tokens; the controller sends them round robin, so replica 0
serves two and replica 1 one. Then a repeated prompt on the replica that cached it (a radix hit),
then one request alone (the other replica runs IDLE forwards all the while). Greedy ids identical
and every sampled token's logprob within 1e-4 of the reference; afterwards every replica's KV pool
is back to its initial free count.

MLA / MoE: tiny DeepSeek-V3.2 (DSA, index_topk 8) with dp 2 × ep 2 (the MoE on every replica's
tokens, or on each rank's own with the all-to-all dispatch), and dp 2 × cp 2 (4 ranks);
tiny DeepSeek-V3 with dp 2 × pp 2 (4 ranks).
"""

from __future__ import annotations

import pytest
import torch

import sglang as sgl
from sglang.srt.model_loader.default_model import find_default_model
from sglang.test.scheduler_harness import SchedulerHarness
from sglang.test.tiny_moe_models import deepseek_v3_config, deepseek_v32_config, save_random_model

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

TOL = 1e-4
LENS = (7, 45, 19)
NEW_TOKENS = (16, 5, 10)  # the requests finish at different steps
CHUNK = 32
ENGINE = dict(
    dtype="float32", chunked_prefill_size=CHUNK, max_total_tokens=2048, num_threads=1, log_level="warning"
)
DP = dict(dp_size=2, enable_dp_attention=True)


def _prompts(vocab: int, lens=LENS, seed: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lens]


def _reference(path: str, prompts: list[list[int]], new_tokens, **kw) -> list[tuple[list[int], list[float]]]:
    ref = SchedulerHarness(model_path=path, chunked_prefill_size=CHUNK, max_total_tokens=2048, **kw)
    rids = [ref.submit(p, n) for p, n in zip(prompts, new_tokens)]
    ref.run()
    out = []
    for rid in rids:
        ids = ref.outputs[rid]
        out.append(
            (ids, [float(torch.log_softmax(lg.float(), -1)[t]) for lg, t in zip(ref.logits[rid], ids)])
        )
    return out


def _check(got: dict, ref: tuple[list[int], list[float]], what: str) -> None:
    ids, logprobs = ref
    assert got["output_ids"] == ids, what
    got_lp = [e[0] for e in got["meta_info"]["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(got_lp, logprobs)) <= TOL, what


def _params(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


def _assert_pools_back(llm, what: str) -> list[dict]:
    states = llm.get_server_info()["internal_states"]
    assert [s["dp_rank"] for s in states] == [0, 1], what
    for s in states:
        assert s["num_running_reqs"] == 0 and s["num_waiting_reqs"] == 0, what
        assert s["available_kv_tokens"] == s["max_total_num_tokens"], (what, s)
    return states


@pytest.fixture(scope="module")
def smollm2():
    path = find_default_model()
    prompts = _prompts(49152)
    alone = _prompts(49152, lens=(23,), seed=7)
    ref = _reference(path, prompts, NEW_TOKENS)
    ref_alone = _reference(path, alone, (12,))
    assert len({tuple(ids) for ids, _ in ref}) == 3
    return path, prompts, alone, ref, ref_alone


@pytest.mark.parametrize("dense_tp", [None, 1], ids=["dense-over-tp", "dense-tp1"])
def test_smollm2_tp2_dp2_matches_single_rank(smollm2, dense_tp):
    path, prompts, alone, ref, ref_alone = smollm2
    with sgl.Engine(model_path=path, tp_size=2, moe_dense_tp_size=dense_tp, **DP, **ENGINE) as llm:
        outs = llm.generate(
            input_ids=prompts, sampling_params=[_params(n) for n in NEW_TOKENS], return_logprob=True
        )
        for i, (got, r) in enumerate(zip(outs, ref)):
            _check(got, r, f"prompt {i}")
        # round robin: prompts 0 and 2 went to replica 0, prompt 1 to replica 1; the next request
        # goes to replica 1, which holds prompt 1's prefix
        again = llm.generate(
            input_ids=prompts[1], sampling_params=_params(NEW_TOKENS[1]), return_logprob=True
        )
        _check(again, ref[1], "radix hit")
        assert again["meta_info"]["cached_tokens"] == len(prompts[1]) - 1
        before = _assert_pools_back(llm, "after the batch")
        # one request alone: replica 0 serves it, replica 1 runs IDLE forwards in lockstep
        got = llm.generate(input_ids=alone[0], sampling_params=_params(12), return_logprob=True)
        _check(got, ref_alone[0], "alone")
        after = _assert_pools_back(llm, "after the lone request")
        assert after[1]["dp_idle_forwards"] - before[1]["dp_idle_forwards"] >= 12
        assert after[0]["dp_idle_forwards"] == before[0]["dp_idle_forwards"]


# ---------------------------------------------------------------------------- MLA / MoE
MLA_CONFIGS = {
    "v32-dp2-ep2": ("v32", dict(tp_size=2, ep_size=2)),
    "v32-dp2-ep2-a2a": ("v32", dict(tp_size=2, ep_size=2, moe_a2a_backend="all_to_all")),
    "v32-dp2-cp2": ("v32", dict(tp_size=4, cp_size=2)),
    "v3-dp2-pp2": ("v3", dict(tp_size=2, pp_size=2)),
}


@pytest.fixture(scope="module")
def mla_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp_mla")
    paths = {"v32": str(root / "v32"), "v3": str(root / "v3")}
    save_random_model(deepseek_v32_config(index_topk=8), paths["v32"], seed=11)
    save_random_model(deepseek_v3_config(), paths["v3"], seed=11)
    prompts = _prompts(256)
    refs = {name: _reference(path, prompts, NEW_TOKENS) for name, path in paths.items()}
    for name, ref in refs.items():
        assert len({tuple(ids) for ids, _ in ref}) == 3, name
    return paths, prompts, refs


@pytest.mark.parametrize("name", list(MLA_CONFIGS))
def test_mla_moe_dp2_matches_single_rank(mla_models, name):
    paths, prompts, refs = mla_models
    model, layout = MLA_CONFIGS[name]
    with sgl.Engine(model_path=paths[model], **layout, **DP, **ENGINE) as llm:
        outs = llm.generate(
            input_ids=prompts, sampling_params=[_params(n) for n in NEW_TOKENS], return_logprob=True
        )
        for i, (got, r) in enumerate(zip(outs, refs[model])):
            _check(got, r, f"{name} prompt {i}")
        states = _assert_pools_back(llm, name)
        assert states[1]["dp_idle_forwards"] > 0, name  # replica 1's one request ended first
