"""Tiny Llama and Qwen3 under tensor parallelism (2 and 4 gloo ranks) vs the single-rank model.

The model runs directly on hand-built batches (ForwardHarness): 3 prompts of different lengths,
chunked prefill mixed with the decodes of requests whose prompt is done, then greedy decoding.
Logits of every step must be within 1e-4 of tp=1 (float32) and the 32 greedy tokens identical.
tiny-llama and tiny-qwen3 both have 4 heads / 2 KV heads, so tp=4 also covers replicated KV heads
(and Qwen3's tied embeddings, q/k norms, head_dim 32 != hidden / heads).
Dummy weights are checked to be identical across tp sizes too.
"""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.model_loader.dummy_loader import init_dummy_weights
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.srt.models.registry import ModelRegistry
from sglang.test.forward_helpers import ForwardHarness
from sglang.test.tiny_models import TINY_LLAMA_DIR, TINY_QWEN3_DIR, write_random_checkpoint
from sglang.test.greedy_loop import chunked_greedy

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

TOL = 1e-4
PROMPT_LENS = (7, 19, 30)
CHUNK = 8
NEW_TOKENS = 32
MODELS = {"llama": TINY_LLAMA_DIR, "qwen3": TINY_QWEN3_DIR}


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def _build(path: str, groups: ParallelGroups, weights: str):
    hf_config = ModelConfig(path).hf_config
    model = ModelRegistry.resolve(hf_config.architectures)(hf_config, groups, torch.float32).eval()
    if weights == "dummy":
        init_dummy_weights(model, seed=3)
    else:
        model.load_weights(iter_safetensors_weights(path))
    return model, hf_config


def generate(path: str, groups: ParallelGroups, weights: str = "ckpt", new_tokens: int = NEW_TOKENS) -> dict:
    """Chunked prefill (decodes of finished prompts ride along) then greedy decoding; every step's logits."""
    model, hf_config = _build(path, groups, weights)
    harness = ForwardHarness(
        hf_config, torch.float32, max_total_tokens=512, max_context_len=128, tp_size=groups.tp.size
    )
    prompts = _prompts(hf_config.vocab_size)
    reqs = [harness.new_request() for _ in prompts]

    def _step(items):
        return harness.forward(model, items).next_token_logits

    outputs, step_logits = chunked_greedy(_step, reqs, prompts, new_tokens, CHUNK)
    return {"tokens": outputs, "logits": step_logits}


def _rank_body(rank: int, world_size: int, paths: dict[str, str]) -> dict:
    groups = ParallelGroups.build(ParallelLayout(tp=world_size), rank)
    out = {name: generate(path, groups) for name, path in paths.items()}
    out["dummy"] = generate(TINY_LLAMA_DIR, groups, weights="dummy", new_tokens=2)
    # every rank sees the same gathered logits
    for name in paths:
        last = out[name]["logits"][-1]
        assert torch.equal(groups.tp.broadcast(last.clone(), src=0), last)
    return out if rank == 0 else {}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tp_ckpt")
    return {name: write_random_checkpoint(src, str(root / name), seed=11) for name, src in MODELS.items()}


@pytest.fixture(scope="module")
def reference(checkpoints) -> dict:
    single = ParallelGroups.single()
    out = {name: generate(path, single) for name, path in checkpoints.items()}
    out["dummy"] = generate(TINY_LLAMA_DIR, single, weights="dummy", new_tokens=2)
    return out


def test_reference_is_not_degenerate(reference):
    for name in MODELS:
        tokens = reference[name]["tokens"]
        assert all(len(t) == NEW_TOKENS for t in tokens)
        assert len({tuple(t) for t in tokens}) == 3 and all(len(set(t)) > 3 for t in tokens)
        # chunked prefill: 30 tokens take 4 chunks; the steps mix prefill chunks with decodes
        assert len(reference[name]["logits"]) == 4 + NEW_TOKENS - 1


@pytest.mark.parametrize("tp_size", [2, 4])
def test_tp_matches_single_rank(tp_size, checkpoints, reference):
    got = run_ranks(_rank_body, tp_size, args=(checkpoints,), timeout=120)[0]
    for name in list(MODELS) + ["dummy"]:
        ref, out = reference[name], got[name]
        assert out["tokens"] == ref["tokens"], name
        assert len(out["logits"]) == len(ref["logits"])
        for step, (a, b) in enumerate(zip(out["logits"], ref["logits"])):
            torch.testing.assert_close(
                a, b, atol=TOL, rtol=0, msg=lambda m: f"{name} tp={tp_size} step {step}: {m}"
            )
