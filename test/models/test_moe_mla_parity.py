"""MoE / MLA / DSA models through the whole scheduler vs HF transformers (tiny random configs, float32).

DeepseekV3ForCausalLM (plain q_proj, YaRN rope + mscale, sigmoid grouped routing, shared expert,
a dense first layer), DeepseekV32ForCausalLM (q-LoRA, Lightning Indexer with index_topk 8, so the
37-token prompt attends sparsely) and Qwen3MoeForCausalLM (softmax routing, q/k norm, a dense layer
from mlp_only_layers). Weights: a seeded HF model saved with save_pretrained, loaded by our loader.
Three prompts of different lengths, the longest chunked (chunked_prefill_size 16) beside decodes,
then a prompt extending a cached one (radix hit: the latent and index-key caches are reused).
Checks: 16 greedy tokens identical, every step's logits within 1e-3.
"""

from __future__ import annotations

import pytest
import torch

from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM, DeepseekV32ForCausalLM
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.test.forward_helpers import ForwardHarness
from sglang.test.scheduler_harness import SchedulerHarness, hf_greedy
from sglang.test.tiny_moe_models import (
    VOCAB,
    deepseek_v3_config,
    deepseek_v32_config,
    qwen3_moe_config,
    save_random_model,
)

NEW_TOKENS = 16
LOGIT_TOL = 1e-3
CONFIGS = {
    "deepseek_v3": deepseek_v3_config,
    "deepseek_v32": deepseek_v32_config,
    "qwen3_moe": qwen3_moe_config,
}


def _prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module", params=list(CONFIGS))
def model(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    hf = save_random_model(CONFIGS[request.param](), path)
    return request.param, path, hf


def _check(h, rid, ref_ids, ref_logits):
    assert h.outputs[rid] == ref_ids, f"{rid}: greedy tokens differ"
    got = h.logits[rid]
    assert len(got) == len(ref_logits)
    diff = max(float((a - b).abs().max()) for a, b in zip(got, ref_logits))
    assert diff <= LOGIT_TOL, f"{rid}: logits max abs diff {diff}"


def test_scheduler_parity_with_hf(model):
    name, path, hf = model
    prompts = _prompts([7, 20, 37], seed=1)
    extended = prompts[1] + _prompts([6], seed=2)[0]
    refs = [hf_greedy(hf, p, NEW_TOKENS) for p in prompts + [extended]]
    assert len({tuple(r[0]) for r in refs}) == 4 and float(refs[2][1][0].std()) > 0.5  # not degenerate

    h = SchedulerHarness(model_path=path, max_total_tokens=1024, chunked_prefill_size=16)
    rids = [h.submit(p, NEW_TOKENS) for p in prompts]
    h.run()
    for rid, (ids, logits) in zip(rids, refs):
        _check(h, rid, ids, logits)
    assert any(n > 1 and tokens > n for n, tokens in h.batch_shapes), "no mixed prefill + decode step"
    rid = h.submit(extended, NEW_TOKENS)
    h.run()
    assert h.cached[rid] >= len(prompts[1])  # the shared prefix came from the radix cache
    _check(h, rid, *refs[3])


def _ours(model_cls, config, weights):
    model = model_cls(config, None, torch.float32).eval()
    model.load_weights(weights)
    return model


def _run(model, config, prompt: list[int], steps: int = 4) -> torch.Tensor:
    """Prefill then `steps` greedy decode steps; the logits of every step."""
    h = ForwardHarness(config, max_total_tokens=256, max_context_len=128)
    h.token_to_kv_pool = model.create_kv_pool(256, 1, torch.float32)
    req = h.new_request()
    logits = [h.forward(model, [(req, prompt)]).next_token_logits[0]]
    for _ in range(steps):
        logits.append(h.forward(model, [(req, [int(logits[-1].argmax())])]).next_token_logits[0])
    return torch.stack(logits)


def test_dsa_topk_covering_sequence_equals_dense_mla(tmp_path):
    """index_topk >= sequence length: V3.2 is exactly dense MLA (V3 on the same weights); with a
    small index_topk the sparse selection changes the logits."""
    path = str(tmp_path)
    save_random_model(deepseek_v32_config(index_topk=64), path, seed=5)
    weights = list(iter_safetensors_weights(path))
    prompt = _prompts([40], seed=3)[0]
    cfg_all = deepseek_v32_config(index_topk=64)
    no_indexer = [w for w in weights if ".indexer." not in w[0]]
    dense = _run(_ours(DeepseekV3ForCausalLM, cfg_all, no_indexer), cfg_all, prompt)
    full = _run(_ours(DeepseekV32ForCausalLM, cfg_all, weights), cfg_all, prompt)
    torch.testing.assert_close(full, dense, atol=1e-5, rtol=0)
    cfg_sparse = deepseek_v32_config(index_topk=8)
    sparse = _run(_ours(DeepseekV32ForCausalLM, cfg_sparse, weights), cfg_sparse, prompt)
    assert float((sparse - dense).abs().max()) > 1e-2
