"""MoE models under expert parallelism (tp 2, ep 2) and MoE tensor parallelism (tp 2, ep 1) on 2 gloo
ranks vs the single-rank model: DeepSeek-V3.2 (MLA heads over attn_tp, DSA indexer replicated,
routed experts split by EP or by intermediate dim, shared expert over tp) and Qwen3-MoE.

One spawn runs both layouts (two sets of process groups). Per layout and model: chunked prefill of
3 prompts mixed with decodes, then greedy decoding; tokens must equal tp=1's and every step's logits
stay within 1e-4. Dummy weights give identical logits under ep 2, and the dispatcher's
partitioned-token mode (ranks holding different tokens) equals the single-rank MoE block.
"""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.moe.moe_block import SparseMoeBlock
from sglang.srt.layers.moe.topk import TopKConfig
from sglang.srt.model_loader.dummy_loader import init_dummy_weights
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.srt.models.registry import ModelRegistry
from sglang.test.forward_helpers import ForwardHarness
from sglang.test.tiny_models import ASSETS_DIR
from sglang.test.tiny_moe_models import deepseek_v32_config, qwen3_moe_config, save_random_model
from sglang.test.greedy_loop import chunked_greedy

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

TOL = 1e-4
PROMPT_LENS = (7, 19, 30)
CHUNK = 8
NEW_TOKENS = 16
TINY_V32_DIR = f"{ASSETS_DIR}/tiny-deepseek-v32"
LAYOUTS = {"ep2": dict(tp=2, moe_ep=2), "tp2": dict(tp=2)}


def generate(path: str, groups: ParallelGroups, weights: str = "ckpt", new_tokens: int = NEW_TOKENS) -> dict:
    """Chunked prefill beside decodes, then greedy decoding; every step's logits."""
    hf_config = ModelConfig(path).hf_config
    model = ModelRegistry.resolve(hf_config.architectures)(hf_config, groups, torch.float32).eval()
    if weights == "dummy":
        init_dummy_weights(model, seed=3)
    else:
        model.load_weights(iter_safetensors_weights(path))
    h = ForwardHarness(
        hf_config, torch.float32, max_total_tokens=512, max_context_len=128, tp_size=groups.tp.size
    )
    h.token_to_kv_pool = model.create_kv_pool(512, 1, torch.float32)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, hf_config.vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    reqs = [h.new_request() for _ in prompts]

    def _step(items):
        return h.forward(model, items).next_token_logits

    outputs, step_logits = chunked_greedy(_step, reqs, prompts, new_tokens, CHUNK)
    return {"tokens": outputs, "logits": step_logits}


def _moe_block(groups: ParallelGroups, tokens_replicated: bool) -> SparseMoeBlock:
    topk = TopKConfig(top_k=2, scoring_func="sigmoid", renormalize=True, num_expert_group=2, topk_group=1)
    block = SparseMoeBlock(
        32,
        4,
        16,
        topk,
        groups,
        torch.float32,
        shared_intermediate_size=16,
        correction_bias=True,
        tokens_replicated=tokens_replicated,
    )
    g = torch.Generator().manual_seed(9)
    block.gate.weight.data.normal_(0, 0.5, generator=g)
    block.gate.e_score_correction_bias.data.normal_(0, 0.1, generator=g)
    for e in range(4):
        for shard, shape in (("w1", (16, 32)), ("w3", (16, 32)), ("w2", (32, 16))):
            param = block.experts.w2_weight if shard == "w2" else block.experts.w13_weight
            block.experts.weight_loader(param, torch.randn(shape, generator=g) * 0.3, (shard, e))
    shared = block.shared_experts
    for i in range(2):
        shared.gate_up_proj.weight_loader(
            shared.gate_up_proj.weight, torch.randn(16, 32, generator=g) * 0.3, i
        )
    shared.down_proj.weight_loader(shared.down_proj.weight, torch.randn(32, 16, generator=g) * 0.3)
    return block


def _partitioned_dispatch_matches(groups: ParallelGroups) -> bool:
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    mine = x[:3] if groups.tp.rank == 0 else x[3:]  # uneven token counts per rank
    with torch.no_grad():
        ref = _moe_block(ParallelGroups.single(), True)(x)
        out = _moe_block(groups, False)(mine)
    ref_mine = ref[:3] if groups.tp.rank == 0 else ref[3:]
    return out.shape == ref_mine.shape and float((out - ref_mine).abs().max()) < 1e-5


def _rank_body(rank: int, world_size: int, paths: dict[str, str]) -> dict:
    out: dict = {}
    for name, sizes in LAYOUTS.items():
        groups = ParallelGroups.build(ParallelLayout(**sizes), rank)
        out[name] = {model: generate(path, groups) for model, path in paths.items()}
        if name == "ep2":
            out[name]["dummy"] = generate(TINY_V32_DIR, groups, weights="dummy", new_tokens=2)
            out[name]["partitioned_ok"] = _partitioned_dispatch_matches(groups)
    return out if rank == 0 else {}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("moe_ckpt")
    paths = {"deepseek_v32": str(root / "v32"), "qwen3_moe": str(root / "qwen3_moe")}
    save_random_model(deepseek_v32_config(), paths["deepseek_v32"], seed=11)
    save_random_model(qwen3_moe_config(), paths["qwen3_moe"], seed=11)
    return paths


def test_ep_and_moe_tp_match_single_rank(checkpoints):
    single = ParallelGroups.single()
    reference = {model: generate(path, single) for model, path in checkpoints.items()}
    reference["dummy"] = generate(TINY_V32_DIR, single, weights="dummy", new_tokens=2)
    for model in checkpoints:
        tokens = reference[model]["tokens"]
        assert len({tuple(t) for t in tokens}) == 3 and all(len(set(t)) > 3 for t in tokens)

    got = run_ranks(_rank_body, 2, args=(checkpoints,), timeout=150)[0]
    assert got["ep2"]["partitioned_ok"]
    for layout in LAYOUTS:
        for model in list(checkpoints) + (["dummy"] if layout == "ep2" else []):
            ref, out = reference[model], got[layout][model]
            assert out["tokens"] == ref["tokens"], (layout, model)
            assert len(out["logits"]) == len(ref["logits"])
            for step, (a, b) in enumerate(zip(out["logits"], ref["logits"])):
                torch.testing.assert_close(
                    a, b, atol=TOL, rtol=0, msg=lambda m: f"{layout} {model} step {step}: {m}"
                )
