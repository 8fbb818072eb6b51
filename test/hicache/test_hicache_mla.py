"""HiCache on an MLA model's pool: the tiny random DeepSeek-V3.2 (latent rows plus the Lightning
Indexer's keys, `DSATokenToKVPool`) through the in-process scheduler, a multi-turn workload whose
KV is several times the pool: the same greedy tokens with and without HiCache, prefixes loaded
back from the host tier (the int8 copy of the index keys too, when the indexer scores in int8)."""

from __future__ import annotations

import pytest
import torch

from sglang.test.scheduler_harness import SchedulerHarness
from sglang.test.tiny_moe_models import VOCAB, save_tiny_v32

POOL = 128


def turns() -> list[list[int]]:
    g = torch.Generator().manual_seed(2)
    hist = [torch.randint(3, VOCAB, (40,), generator=g).tolist() for _ in range(3)]
    out = []
    for _ in range(3):
        for k in range(3):
            hist[k] = hist[k] + torch.randint(3, VOCAB, (8,), generator=g).tolist()
            out.append(list(hist[k]))
    return out


def run(path: str, hicache: bool) -> SchedulerHarness:
    h = SchedulerHarness(model_path=path, max_total_tokens=POOL, enable_hierarchical_cache=hicache)
    for prompt in turns():  # one turn at a time, as a conversation's turns arrive
        h.submit(prompt, 4)
        h.run()
    return h


@pytest.mark.parametrize("index_scores", ["model dtype", "int8"])
def test_dsa_pool_round_trips_through_the_host_tier(tmp_path, monkeypatch, index_scores):
    """Also with the int8 copy of the index keys (int8 scoring): restored with the keys, or the
    indexer would score a loaded prefix on stale rows."""
    if index_scores == "int8":
        monkeypatch.setenv("SGLANG_DSA_INDEX_SCORE_DTYPE", "int8")
    path = save_tiny_v32(tmp_path)
    assert sum(len(p) for p in turns()) > 3 * POOL
    plain, hi = run(path, False), run(path, True)
    assert hi.outputs == plain.outputs
    state = hi.scheduler.internal_state()
    assert state["hicache_l2_hit_tokens"] > 0
    assert state["prefill_tokens_computed"] < plain.scheduler.internal_state()["prefill_tokens_computed"]
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
    if index_scores == "int8":  # every cached row's int8 copy is the quantized keys it holds
        from sgl_kernel_npu.reference import quantize_int8

        pool, tree = hi.scheduler.runner.token_to_kv_pool, hi.scheduler.cache.tree
        slots = torch.cat([n.value for n in tree._all_nodes() if n.value is not None])
        for layer in range(pool.layer_num):
            k8, scale8 = quantize_int8(pool.get_index_k_buffer(layer)[slots])
            assert torch.equal(pool.index_k_int8[layer][slots], k8)
            assert torch.equal(pool.index_k_scale[layer][slots], scale8)
