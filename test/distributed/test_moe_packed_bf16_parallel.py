"""bf16 routed experts packed for this CPU's packed linear (`prepack_linear_weights` on `FusedMoE`)
under MoE tensor parallelism (tp 2: each rank packs its half of every expert's intermediate dim)
and expert parallelism (tp 2, ep 2: each rank packs its own two experts) on 2 gloo ranks, against
the single rank's packed bf16 block and the float32 block with the same weights.

The whole-model parity tests run float32, which is never packed: this is where the packed experts'
per-rank slices and expert offsets are checked at tp / ep > 1. A rank packing the wrong expert or
the wrong slice moves the output by O(1), far past the bf16 tolerance below."""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.linear_prepack import prepack_linear_weights
from sglang.srt.layers.moe.moe_block import SparseMoeBlock
from sglang.srt.layers.moe.topk import TopKConfig
from sglang.srt.platforms import get_platform

pytestmark = pytest.mark.slow  # spawns gloo ranks

HIDDEN, EXPERTS, INTER, SHARED = 64, 4, 64, 32  # at tp 2: 32 of each expert's gate / up rows a rank
ROWS = (1, 5, 33)  # decode, a small batch, a prefill chunk
LAYOUTS = {"tp2": dict(tp=2), "ep2": dict(tp=2, moe_ep=2)}
# bf16 partial sums: ep 2 adds two experts' outputs per rank then all-reduces, tp 2 splits each
# expert's down projection over the ranks; the single rank sums in another order
BF16_TOL = 3e-2
F32_TOL = 6e-2  # packed bf16 against the float32 block (bf16 weights, activations, products)


def _block(groups: ParallelGroups, dtype: torch.dtype) -> SparseMoeBlock:
    topk = TopKConfig(top_k=2, scoring_func="softmax", renormalize=True)
    block = SparseMoeBlock(HIDDEN, EXPERTS, INTER, topk, groups, dtype, shared_intermediate_size=SHARED)
    g = torch.Generator().manual_seed(9)
    block.gate.weight.data.copy_(torch.randn(EXPERTS, HIDDEN, generator=g).to(dtype))
    for e in range(EXPERTS):
        for shard, shape in (("w1", (INTER, HIDDEN)), ("w3", (INTER, HIDDEN)), ("w2", (HIDDEN, INTER))):
            param = block.experts.w2_weight if shard == "w2" else block.experts.w13_weight
            block.experts.weight_loader(param, (torch.randn(shape, generator=g) * 0.2).to(dtype), (shard, e))
    shared = block.shared_experts
    for i in range(2):
        w = (torch.randn(SHARED, HIDDEN, generator=g) * 0.2).to(dtype)
        shared.gate_up_proj.weight_loader(shared.gate_up_proj.weight, w, i)
    shared.down_proj.weight_loader(
        shared.down_proj.weight, (torch.randn(HIDDEN, SHARED, generator=g) * 0.2).to(dtype)
    )
    return block


def _inputs() -> list[torch.Tensor]:
    return [torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(n)) for n in ROWS]


def _run(groups: ParallelGroups, dtype: torch.dtype, pack: bool) -> dict:
    block = _block(groups, dtype)
    if pack:
        prepack_linear_weights(block, get_platform("cpu"))
    packed = block.experts.packed_experts
    with torch.no_grad():
        outs = [block(x.to(dtype)).float() for x in _inputs()]
    return {"outs": outs, "packed": 0 if packed is None else len(packed[0])}


def _rank_body(rank: int, world_size: int) -> dict:
    out = {}
    for name, sizes in LAYOUTS.items():
        out[name] = _run(ParallelGroups.build(ParallelLayout(**sizes), rank), torch.bfloat16, pack=True)
    return out


def test_packed_bf16_experts_at_tp2_and_ep2_match_single_rank():
    if get_platform("cpu").prepacked_linear(torch.bfloat16, torch.device("cpu")) is None:
        pytest.skip("this CPU's platform packs no bf16 linear")
    single = ParallelGroups.single()
    ref = _run(single, torch.bfloat16, pack=True)
    f32 = _run(single, torch.float32, pack=False)
    assert ref["packed"] == EXPERTS
    for a, b in zip(ref["outs"], f32["outs"]):
        assert float(b.abs().mean()) > 0.05  # the experts contribute: a wrong pack would show
        torch.testing.assert_close(a, b, rtol=F32_TOL, atol=F32_TOL)

    ranks = run_ranks(_rank_body, 2, timeout=120)
    for name in LAYOUTS:
        local_experts = EXPERTS // 2 if name == "ep2" else EXPERTS
        for rank, got in enumerate(ranks):
            assert got[name]["packed"] == local_experts, (name, rank)
            for rows, a, b in zip(ROWS, got[name]["outs"], ref["outs"]):
                torch.testing.assert_close(
                    a, b, rtol=BF16_TOL, atol=BF16_TOL, msg=lambda m: f"{name} rank {rank} rows {rows}: {m}"
                )
