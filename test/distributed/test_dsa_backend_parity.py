"""The `dsa` attention backend (sgl_kernel_npu's fused CPU ops) on tiny DeepSeek-V3.2 vs the reference
backend (`torch_native`, torch ops), float32, through the CP test driver (`sglang.test.cp_moe_driver`):
3 odd-length prompts prefilled in chunks of 12 beside decodes, 16 greedy tokens each, then a
radix-cache hit beside a fresh prompt (all logits). index_topk 8, so every step but the first
chunks selects sparsely (prefill chunks over a cached prefix, fresh prefills, decodes).

Greedy tokens identical and every step's logits within 1e-4 of the reference backend at cp = 1,
and at cp = 2 (zigzag and round-robin: own-query indexer over the gathered rows, decode candidates
from each rank's shard merged into the global top-k, partials merged by LSE) on gloo ranks.
"""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.test.cp_moe_driver import generate
from sglang.test.tiny_moe_models import deepseek_v32_config, save_random_model

pytestmark = pytest.mark.slow  # spawns gloo ranks

TOL = 1e-4
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("dsa_backend_ckpt") / "v32")
    save_random_model(deepseek_v32_config(index_topk=8), path, seed=11)
    return path


@pytest.fixture(scope="module")
def reference(checkpoint) -> dict:
    return generate(checkpoint, ParallelGroups.single(), "zigzag", NEW_TOKENS, attention_backend="torch_native")


def _same(got: dict, ref: dict, tag: str) -> None:
    assert got["tokens"] == ref["tokens"], tag
    assert len(got["logits"]) == len(ref["logits"])
    for step, (a, b) in enumerate(zip(got["logits"], ref["logits"])):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=lambda m: f"{tag} step {step}: {m}")


def test_reference_is_sparse_and_not_degenerate(reference):
    tokens = reference["tokens"]
    assert all(len(t) == NEW_TOKENS for t in tokens) and len({tuple(t) for t in tokens}) == 3


def test_dsa_backend_cp1_matches_reference(checkpoint, reference):
    got = generate(checkpoint, ParallelGroups.single(), "zigzag", NEW_TOKENS, attention_backend="dsa")
    _same(got, reference, "cp1 dsa")


def _cp2(rank: int, world_size: int, path: str) -> list:
    groups = ParallelGroups.build(ParallelLayout(tp=2, attn_cp=2), rank)
    return [generate(path, groups, s, NEW_TOKENS, attention_backend="dsa") for s in ("zigzag", "round-robin")]


def test_dsa_backend_cp2_matches_reference(checkpoint, reference):
    results = run_ranks(_cp2, 2, args=(checkpoint,), timeout=500)
    for rank, runs in enumerate(results):
        for strategy, got in zip(("zigzag", "round-robin"), runs):
            _same(got, reference, f"cp2 {strategy} rank {rank}")
