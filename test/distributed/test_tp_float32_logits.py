"""Float32 logits of a bf16 LM head under tensor parallelism: each rank packs its own vocabulary
shard for the CPU kernel (`linear_f32out_packed`, layers/linear_float32_out.py) and the shards'
float32 logits are all-gathered. The result must equal the single-rank head's float32 logits of the
same bf16 weight (both are float32 sums of exactly widened bf16 products; only the summation order
may differ), including a vocabulary that tp does not divide (padded last shard) and a bias."""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.linear_float32_out import float32_logits_packing
from sglang.srt.layers.vocab_embedding import ParallelLMHead

pytestmark = pytest.mark.slow  # spawns gloo ranks

VOCAB, HIDDEN, ROWS = 1001, 96, 5


def _inputs():
    g = torch.Generator().manual_seed(11)
    w = (torch.randn(VOCAB, HIDDEN, generator=g) * 0.5).bfloat16()
    b = torch.randn(VOCAB, generator=g).bfloat16()
    h = (torch.randn(ROWS, HIDDEN, generator=g) * 4).bfloat16()
    return w, b, h


def _head(tp, w, b) -> ParallelLMHead:
    head = ParallelLMHead(VOCAB, HIDDEN, tp=tp, params_dtype=torch.bfloat16, bias=True)
    head.weight.weight_loader(head.weight, w)
    head.bias.weight_loader(head.bias, b)
    head.set_float32_logits(float32_logits_packing(head.weight))
    return head


def _body(rank: int, world_size: int) -> dict:
    groups = ParallelGroups.build(ParallelLayout(tp=world_size), rank)
    w, b, h = _inputs()
    head = _head(groups.tp, w, b)
    return {"logits": head.compute_logits(h), "packed": head.float32_packed is not None}


@pytest.mark.parametrize("tp_size", [2, 3])
def test_float32_logits_of_sharded_bf16_head_match_one_rank(tp_size):
    w, b, h = _inputs()
    single = _head(None, w, b)
    want = single.compute_logits(h)
    reference = h.float() @ w.float().T + b.float()  # exact products, float32 sums
    torch.testing.assert_close(want, reference, atol=2e-4, rtol=1e-5)
    results = run_ranks(_body, tp_size)
    for r in results:
        got = r["logits"]
        assert got.dtype == torch.float32 and got.shape == (ROWS, VOCAB)
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-5)
        assert r["packed"] == (single.float32_packed is not None)  # same kernel path as one rank
    # float32 values, not bf16 logits widened: most are off bf16's grid
    assert (want != want.bfloat16().float()).float().mean() > 0.9
