"""DP attention at the model level (docs/dp_attention.md): the attention-DP replicas of one stage run
their own requests in lockstep, the layers between them gather every replica's tokens (FULL) around
the MLPs / MoE sharded over the whole tp group, and each replica's logits must equal the
single-rank model run on that replica's requests alone (float32, 1e-4), greedy tokens identical.

Replica 0 has three prompts (chunked prefill beside decodes), replica 1 two shorter ones and fewer
new tokens, so it runs IDLE forwards (no tokens, every collective joined) for the last steps.
Every step the replicas agree on their token / logit-row counts (an all-gather over the stage's tp
group, as the scheduler does) and stop when no replica has work.

Layouts (2 gloo ranks unless said): tp 2 × dp 2 (attn_tp 1: the MLP over both replicas, one
all-reduce gathers); `moe_dense_tp=1` (dense MLP replicated: no cross-replica collective in
dense layers); `dp_lm_head` (LM head inside the replica); 4 ranks tp 4 × dp 2 (attn_tp 2: the
partial gather completes o_proj's reduction); MoE models with ep 2 under dp 2, with the MoE on
every replica's tokens (FULL) or on each rank's own tokens with the all-to-all dispatch (SCATTERED).
"""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.model_executor.forward_batch import DPForwardInfo
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.srt.models.registry import ModelRegistry
from sglang.test.forward_helpers import ForwardHarness
from sglang.test.greedy_loop import GreedyStepper
from sglang.test.tiny_models import TINY_LLAMA_DIR, TINY_QWEN3_DIR, write_random_checkpoint
from sglang.test.tiny_moe_models import deepseek_v32_config, qwen3_moe_config, save_random_model

pytestmark = pytest.mark.slow  # spawns gloo ranks

TOL = 1e-4
CHUNK = 8
# (prompt lengths, new tokens) per replica: replica 1 finishes early and then runs IDLE forwards
REPLICAS = (((7, 19, 30), 12), ((11, 5), 4))
DENSE = ("llama", "qwen3")
MOE = ("qwen3_moe", "deepseek_v32")
LAYOUTS_2 = {
    "dp2": dict(tp=2, attn_dp=2),
    "dp2_dense_tp1": dict(tp=2, attn_dp=2, moe_dense_tp=1),
    "dp2_lm_head": dict(tp=2, attn_dp=2, dp_lm_head=True),
    "dp2_ep2": dict(tp=2, attn_dp=2, moe_ep=2),
    "dp2_ep2_a2a": dict(tp=2, attn_dp=2, moe_ep=2, moe_a2a=True),  # MoE SCATTERED, all-to-all dispatch
}
LAYOUTS_4 = {"dp2_attn_tp2": dict(tp=4, attn_dp=2)}


def _prompts(vocab: int, replica: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5 + replica)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in REPLICAS[replica][0]]


def _build(path: str, groups: ParallelGroups):
    hf_config = ModelConfig(path).hf_config
    model = ModelRegistry.resolve(hf_config.architectures)(hf_config, groups, torch.float32).eval()
    model.load_weights(iter_safetensors_weights(path))
    harness = ForwardHarness(
        hf_config, torch.float32, max_total_tokens=512, max_context_len=128, tp_size=groups.attn_tp.size
    )
    harness.token_to_kv_pool = model.create_kv_pool(512, 1, torch.float32)
    return model, harness, hf_config


def run_replica(path: str, groups: ParallelGroups, replica: int) -> dict:
    """This rank's replica's requests, stepped in lockstep with the other replicas."""
    model, harness, hf_config = _build(path, groups)
    prompts = _prompts(hf_config.vocab_size, replica)
    stepper = GreedyStepper([harness.new_request() for _ in prompts], prompts, REPLICAS[replica][1], CHUNK)
    per_rank = groups.replica.size
    idle_steps = 0
    while True:
        items = stepper.next_items()
        counts = groups.tp.all_gather_object((sum(len(t) for _, t in items), len(items)))
        tokens = tuple(c[0] for c in counts[::per_rank])
        rows = tuple(c[1] for c in counts[::per_rank])
        if not any(tokens):
            break
        dp = DPForwardInfo(replica=replica, num_tokens=tokens, num_logit_rows=rows)
        if items:
            batch = harness.build_batch(items)
            batch.dp = dp
            stepper.feed(harness.run(model, batch).next_token_logits)
        else:
            out = harness.run(model, harness.idle_batch(dp))
            assert out.next_token_logits.shape[0] == 0
            idle_steps += 1
    return {"tokens": stepper.outputs, "logits": stepper.step_logits, "idle_steps": idle_steps}


def run_alone(path: str, replica: int) -> dict:
    model, harness, hf_config = _build(path, ParallelGroups.single())
    prompts = _prompts(hf_config.vocab_size, replica)
    stepper = GreedyStepper([harness.new_request() for _ in prompts], prompts, REPLICAS[replica][1], CHUNK)
    while not stepper.done:
        stepper.feed(harness.run(model, harness.build_batch(stepper.next_items())).next_token_logits)
    return {"tokens": stepper.outputs, "logits": stepper.step_logits}


def _rank_body(rank: int, world_size: int, layouts: dict, paths: dict[str, str]) -> dict:
    out: dict = {}
    for name, sizes in layouts.items():
        groups = ParallelGroups.build(ParallelLayout(**sizes), rank)
        models = MOE if "ep" in name else DENSE
        out[name] = {m: run_replica(paths[m], groups, groups.dp_rank) for m in models}
    # one result per replica: its first rank's
    return out if groups.replica.is_first else {}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("dp_ckpt")
    paths = {
        "llama": write_random_checkpoint(TINY_LLAMA_DIR, str(root / "llama"), seed=11),
        "qwen3": write_random_checkpoint(TINY_QWEN3_DIR, str(root / "qwen3"), seed=11),
        "deepseek_v32": str(root / "v32"),
        "qwen3_moe": str(root / "qwen3_moe"),
    }
    save_random_model(deepseek_v32_config(), paths["deepseek_v32"], seed=11)
    save_random_model(qwen3_moe_config(), paths["qwen3_moe"], seed=11)
    return paths


@pytest.fixture(scope="module")
def reference(checkpoints) -> dict:
    ref = {m: [run_alone(path, d) for d in range(2)] for m, path in checkpoints.items()}
    for m in ref:  # not degenerate: different prompts give different continuations
        tokens = [tuple(t) for d in range(2) for t in ref[m][d]["tokens"]]
        assert len(set(tokens)) == len(tokens), m
    return ref


def _check(got_by_rank: list[dict], reference: dict, layouts: dict, ranks_per_replica: int) -> None:
    for name in layouts:
        for d in range(2):
            got = got_by_rank[d * ranks_per_replica][name]
            for model, out in got.items():
                ref = reference[model][d]
                assert out["tokens"] == ref["tokens"], (name, model, d)
                assert len(out["logits"]) == len(ref["logits"])
                for step, (a, b) in enumerate(zip(out["logits"], ref["logits"])):
                    torch.testing.assert_close(
                        a, b, atol=TOL, rtol=0, msg=lambda m: f"{name} {model} replica {d} step {step}: {m}"
                    )
            if d == 1:  # the short replica idled while replica 0 still had work
                assert all(out["idle_steps"] > 0 for out in got.values()), name


def test_dp2_on_two_ranks_matches_single_rank(checkpoints, reference):
    got = run_ranks(_rank_body, 2, args=(LAYOUTS_2, checkpoints), timeout=240)
    _check(got, reference, LAYOUTS_2, 1)


def test_dp2_with_attention_tp2_matches_single_rank(checkpoints, reference):
    got = run_ranks(_rank_body, 4, args=(LAYOUTS_4, checkpoints), timeout=240)
    _check(got, reference, LAYOUTS_4, 2)
