"""The tiny FP8 block-quantized DeepSeek-V3.2 (16 x 16 blocks, `sglang.test.tiny_fp8_models`) on
gloo ranks: at tp 2 (weights and their block scales sharded together, routed experts' too), ep 2
(routed experts split, FP8 with their scales), pp 2 and cp 2 (attention tp 1): greedy tokens identical to, and every step's
logits within 1e-3 of, the same weights dequantized to float32 run at tp 1 (the CP test driver:
chunked prefills beside decodes, then a radix-cache hit). Shard Linear on the 1-byte q_b_proj /
o_proj is refused by name."""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.test.cp_moe_driver import generate, load_model
from sglang.test.tiny_fp8_models import save_fp8_pair

pytestmark = pytest.mark.slow  # spawns gloo ranks

TOL = 1e-3
NEW_TOKENS = 8
LAYOUTS = ({"tp": 2}, {"tp": 2, "moe_ep": 2}, {"pp": 2}, {"tp": 2, "attn_cp": 2})


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_fp8_pair(tmp_path_factory.mktemp("fp8_parallel"))


def _same(got: dict, ref: dict, tag: str) -> None:
    assert got["tokens"] == ref["tokens"], tag
    assert len(got["logits"]) == len(ref["logits"])
    for step, (a, b) in enumerate(zip(got["logits"], ref["logits"])):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=lambda m: f"{tag} step {step}: {m}")


def _shard_linear_refused(path: str, groups: ParallelGroups) -> str:
    """--enable-shard-linear on the 1-byte q_b_proj / o_proj: the error, or "" when accepted."""
    _, model = load_model(path, groups)
    try:
        model.enable_shard_linear()
    except ValueError as err:
        return str(err)
    return ""


def _ranks(rank: int, world_size: int, path: str) -> list:
    runs = [
        generate(path, ParallelGroups.build(ParallelLayout(**lay), rank), "zigzag", NEW_TOKENS)
        for lay in LAYOUTS
    ]
    return [runs, _shard_linear_refused(path, ParallelGroups.build(ParallelLayout(tp=2, attn_cp=2), rank))]


def test_fp8_parallel_matches_dequantized_tp1(pair):
    fp8_dir, deq_dir = pair
    ref = generate(deq_dir, ParallelGroups.single(), "zigzag", NEW_TOKENS)
    assert len({tuple(t) for t in ref["tokens"]}) == 3  # not degenerate
    fp8_tp1 = generate(fp8_dir, ParallelGroups.single(), "zigzag", NEW_TOKENS)
    _same(fp8_tp1, ref, "fp8 tp1")
    assert fp8_tp1["param_bytes"] < 0.5 * ref["param_bytes"]  # 1-byte weights, routed experts included
    results = run_ranks(_ranks, 2, args=(fp8_dir,), timeout=500)
    for rank, (runs, shard_linear_error) in enumerate(results):
        assert "--enable-shard-linear is not supported with quantized" in shard_linear_error, rank
        for lay, got in zip(LAYOUTS, runs):
            if "pp" in lay and rank == 0:
                continue  # the first pipeline stage computes no logits
            _same(got, ref, f"fp8 {lay} rank {rank}")
