"""The `dsa` attention backend (sgl_kernel_npu's fused CPU ops) on tiny DeepSeek-V3.2 vs the reference
backend (`torch_native`, torch ops), float32, through the CP test driver (`sglang.test.cp_moe_driver`):
3 odd-length prompts prefilled in chunks of 12 beside decodes, 16 greedy tokens each, then a
radix-cache hit beside a fresh prompt (all logits). index_topk 8, so every step but the first
chunks selects sparsely (prefill chunks over a cached prefix, fresh prefills, decodes).

Greedy tokens identical and every step's logits within 1e-4 of the reference backend at cp = 1,
and at cp = 2 (zigzag and round-robin: own-query indexer over the gathered rows, decode candidates
from each rank's shard merged into the global top-k, partials merged by LSE) on gloo ranks.

Shard Linear (cp = 2, a 6-layer variant so that sharding saves memory): q_b_proj / o_proj held by
rank layer % 2 and broadcast before use; logits bit-identical to the same run without it, tokens
identical to the reference, and this rank's weight bytes for the series below the unsharded ones.
"""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.test.cp_moe_driver import generate
from sglang.test.tiny_moe_models import DEEPSEEK_SIZES, save_random_model, save_tiny_v32
from transformers import DeepseekV32Config

pytestmark = pytest.mark.slow  # spawns gloo ranks

TOL = 1e-4
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return save_tiny_v32(tmp_path_factory.mktemp("dsa_backend_ckpt") / "v32")


@pytest.fixture(scope="module")
def reference(checkpoint) -> dict:
    return generate(
        checkpoint, ParallelGroups.single(), "zigzag", NEW_TOKENS, attention_backend="torch_native"
    )


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


def test_dsa_backend_paged_blocks_match_reference(checkpoint, reference):
    """Pool pages of 4 become the ops' PA_BSND blocks (block table of page ids)."""
    got = generate(
        checkpoint, ParallelGroups.single(), "zigzag", NEW_TOKENS, page_size=4, attention_backend="dsa"
    )
    _same(got, reference, "cp1 dsa page 4")


def _cp2(rank: int, world_size: int, path: str) -> list:
    groups = ParallelGroups.build(ParallelLayout(tp=2, attn_cp=2), rank)
    return [generate(path, groups, s, NEW_TOKENS, attention_backend="dsa") for s in ("zigzag", "round-robin")]


def test_dsa_backend_cp2_matches_reference(checkpoint, reference):
    results = run_ranks(_cp2, 2, args=(checkpoint,), timeout=500)
    for rank, runs in enumerate(results):
        for strategy, got in zip(("zigzag", "round-robin"), runs):
            _same(got, reference, f"cp2 {strategy} rank {rank}")


@pytest.fixture(scope="module")
def checkpoint6(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("dsa_backend_ckpt6") / "v32")
    cfg = DeepseekV32Config(
        q_lora_rank=32,
        index_n_heads=16,
        index_head_dim=32,
        index_topk=8,
        **{**DEEPSEEK_SIZES, "num_hidden_layers": 6},
    )
    save_random_model(cfg, path, seed=12)
    return path


def _shard(rank: int, world_size: int, path: str) -> list:
    groups = ParallelGroups.build(ParallelLayout(tp=2, attn_cp=2), rank)
    return [
        generate(path, groups, "zigzag", NEW_TOKENS, attention_backend="dsa", shard_linear=on)
        for on in (False, True)
    ]


def test_shard_linear_cp2_identical_and_smaller(checkpoint6):
    ref = generate(
        checkpoint6, ParallelGroups.single(), "zigzag", NEW_TOKENS, attention_backend="torch_native"
    )
    results = run_ranks(_shard, 2, args=(checkpoint6,), timeout=500)
    per_layer = None
    for rank, (off, on) in enumerate(results):
        assert on["tokens"] == off["tokens"] == ref["tokens"], rank
        for step, (a, b) in enumerate(zip(on["logits"], off["logits"])):
            assert torch.equal(a, b), (rank, step)  # a broadcast copies the bits
        layers = 6
        saved = off["param_bytes"] - on["param_bytes"]  # the non-owned layers' weights are gone
        per_layer = saved // (layers - 3)
        assert saved > 0 and saved % (layers - 3) == 0
        # owned 3 layers + one window (cp 2: never two foreign layers in a row) = 4 of 6 layers
        assert on["shard_bytes"] == 4 * per_layer, (rank, on["shard_bytes"], per_layer)
        assert on["shard_broadcasts"] > 0
