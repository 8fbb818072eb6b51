"""DeepSeek-V3.2 (MLA + DSA, MoE) under context parallelism through the whole engine (scheduler
processes, virtual slot space, the model's latent / index-key pool per rank and pipeline stage)
vs the in-process single-rank scheduler, float32.

Workload: 3 prompts of odd lengths (the 45-token one prefilled over 3 chunks of 16 beside decodes),
16 greedy tokens each, then the long prompt again (a radix hit). index_topk 8, so attention is
sparse. Greedy ids identical and every sampled token's logprob within 1e-4 of the reference
(log-softmax of its logits). Layouts: pp 2 x cp 2 (zigzag), and cp 2 with `--cp-min-split-tokens
12` (adaptive CP: prompts below and above the threshold in one batch; the short one's tokens
counted by `cp_unsplit_prefill_tokens`, the suite's default being 0, always split), and cp 2 with
`--enable-cp-dense-tp` (embedding / LM head vocab-sharded over the cp group).
"""

from __future__ import annotations

import pytest
import torch

import sglang as sgl
from sglang.test.scheduler_harness import SchedulerHarness
from sglang.test.tiny_moe_models import deepseek_v32_config, save_random_model

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

NEW_TOKENS = 16
TOL = 1e-4
ENGINE = dict(
    dtype="float32", chunked_prefill_size=16, max_total_tokens=4096, num_threads=1, log_level="warning"
)
# cp 2 alone, round-robin and ep 2 are covered on hand-built batches (test_cp_mla_parity.py)
CONFIGS = {
    "pp2-cp2": dict(cp_size=2, pp_size=2, cp_strategy="zigzag"),
    # adaptive CP (as test_cp_engine_parity.py's dense case): the 7-token prompt runs whole on both
    # ranks (MLA / DSA attention local, its last token's logits on both), the 19-token one and the
    # 45-token one's 16-token chunks are split
    "cp2-min-split-12": dict(cp_size=2, cp_min_split_tokens=12),
    # embedding / LM head vocab-sharded over the cp group (layers/cp_dense_tp.py)
    "cp2-dense-tp": dict(cp_size=2, enable_cp_dense_tp=True),
}


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in (7, 19, 45)]


@pytest.fixture(scope="module")
def model_and_reference(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cp_v32"))
    save_random_model(deepseek_v32_config(index_topk=8), path, seed=11)
    prompts = _prompts()
    ref = SchedulerHarness(model_path=path, chunked_prefill_size=16, max_total_tokens=4096)
    rids = [ref.submit(p, NEW_TOKENS) for p in prompts]
    ref.run()
    out = []
    for rid in rids:
        ids = ref.outputs[rid]
        logprobs = [float(torch.log_softmax(lg.float(), -1)[t]) for lg, t in zip(ref.logits[rid], ids)]
        out.append((ids, logprobs))
    assert len({tuple(ids) for ids, _ in out}) == 3 and all(len(set(ids)) > 3 for ids, _ in out)
    return path, prompts, out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_v32_engine_cp_matches_single_rank(model_and_reference, name):
    path, prompts, ref = model_and_reference
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    with sgl.Engine(model_path=path, **ENGINE, **CONFIGS[name]) as llm:
        outs = llm.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        again = llm.generate(input_ids=prompts[2], sampling_params=params, return_logprob=True)
        unsplit = llm.get_server_info()["internal_states"][0]["cp_unsplit_prefill_tokens"]
    min_split = CONFIGS[name].get("cp_min_split_tokens", 0)
    if min_split == 0:
        assert unsplit == 0, name
    else:  # the short prompt whole (and first chunks the budget cut under 12), never all of them
        assert sum(len(p) for p in prompts if len(p) < min_split) <= unsplit < sum(map(len, prompts)), unsplit
    assert again["meta_info"]["cached_tokens"] == (len(prompts[2]) - 1) // 2 * 2  # whole virtual pages
    for (ids, logprobs), got in zip(ref + [ref[2]], outs + [again]):
        assert got["output_ids"] == ids, name
        got_lp = [e[0] for e in got["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got_lp, logprobs)) <= TOL, name


@pytest.mark.parametrize("backend", [None, "dsa"])
def test_v32_cp2_one_token_prompt_beside_a_long_one(tmp_path, backend):
    """A 1-token prompt is a replicated (decode-like) query whose only key lives on cp rank 0, so
    rank 1 has no key of any decode-like query in that step, while the 20-token prompt beside it
    makes the step sparse: the indexer's top-k over zero local keys must not fail (it did)."""
    path = str(tmp_path / "v32")
    save_random_model(deepseek_v32_config(index_topk=8), path, seed=11)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (1, 20)]
    ref = SchedulerHarness(model_path=path, chunked_prefill_size=16, max_total_tokens=4096)
    rids = [ref.submit(p, 6) for p in prompts]
    ref.run()
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    with sgl.Engine(model_path=path, cp_size=2, attention_backend=backend, **ENGINE) as llm:
        outs = llm.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == [ref.outputs[r] for r in rids]
