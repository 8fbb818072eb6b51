"""HiCache on an MLA model's pool: the tiny random DeepSeek-V3.2 (latent rows plus the Lightning
Indexer's keys, `DSATokenToKVPool`) through the in-process scheduler, a multi-turn workload whose
KV is several times the pool: the same greedy tokens with and without HiCache, prefixes loaded
back from the host tier."""

from __future__ import annotations

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


def test_dsa_pool_round_trips_through_the_host_tier(tmp_path):
    path = save_tiny_v32(tmp_path)
    assert sum(len(p) for p in turns()) > 3 * POOL
    plain, hi = run(path, False), run(path, True)
    assert hi.outputs == plain.outputs
    state = hi.scheduler.internal_state()
    assert state["hicache_l2_hit_tokens"] > 0
    assert state["prefill_tokens_computed"] < plain.scheduler.internal_state()["prefill_tokens_computed"]
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
