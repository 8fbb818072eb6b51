"""HiCache under pipeline parallelism, in one process (no ring): stage 0's tree records its tier
copies and a later stage's `StageTiers` replays them on a KV pool of its own (other layers: other
values), as `managers/pp/hicache_ring.py` does between processes. The later stage's pool must hold
its own KV of every prefix the tree loads from L2 or L3, and an L3 prefix readable on stage 0 only
must not load anywhere."""

from __future__ import annotations

import os

import torch

from sglang.srt.mem_cache.hicache.file_storage import FileStorage
from sglang.srt.mem_cache.hicache.host_pool import HostKVPool, kv_token_buffers
from sglang.srt.mem_cache.hicache.pipeline import RingPeers, StageTiers
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool

from test_hicache_tiers import PAGE, accounting_ok, fill, make_tree, read

L1, L2, SP = 16, 32, 4


def two_stages(directory: str):
    tree, pool0, alloc = make_tree(L1, L2, storage=FileStorage(directory, "stage0", SP))
    pool1 = MHATokenToKVPool(L1, PAGE, torch.float32, head_num=2, head_dim=4, layer_num=2)
    tiers = StageTiers(HostKVPool(kv_token_buffers(pool1), L2, PAGE), FileStorage(directory, "stage1", SP))

    def ask(query, ops):  # the ring: the pending ops travel ahead of the query
        tiers.apply(ops)
        return tiers.answer(query)

    tree.enable_pipeline(RingPeers(ask))
    return tree, alloc, pool0, pool1, tiers


def micro_batch(tree, tiers, alloc, pools, tokens, seed):
    """Prefill `tokens` on both stages (the stage replays stage 0's ops first) and cache them."""
    if alloc.available_size() < len(tokens):
        tree.evict(len(tokens) - alloc.available_size())
    slots = alloc.alloc(len(tokens))
    tiers.apply(tree.take_ops())
    rows = [fill(pool, slots, seed + 1000 * k) for k, pool in enumerate(pools)]
    assert tree.insert(tokens, slots) == 0
    return rows


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_later_stage_mirrors_the_tiers_of_stage_0(tmp_path):
    d = str(tmp_path)
    tree, alloc, pool0, pool1, tiers = two_stages(d)
    seqs = [list(range(100 * k, 100 * k + 8)) for k in range(1, 5)]  # 32 tokens: twice L1
    rows = [micro_batch(tree, tiers, alloc, (pool0, pool1), s, k) for k, s in enumerate(seqs)]
    m = tree.match_and_load(seqs[0] + [7])  # evicted to L2: restored on both stages
    tiers.apply(tree.take_ops())
    assert m.prefix_len == 8 and tree.hstats.l2_hit_tokens == 8
    assert same(read(pool0, m.indices), rows[0][0]) and same(read(pool1, m.indices), rows[0][1])
    assert accounting_ok(tree, alloc)

    # a restart: empty L1 / L2 on both stages; each stage loads its own pages of the prefix
    tree, alloc, pool0, pool1, tiers = two_stages(d)
    m = tree.match_and_load(seqs[2] + [7])
    tiers.apply(tree.take_ops())
    assert m.prefix_len == 8 and tree.hstats.l3_hit_tokens == 8 and tiers.staged == {}
    assert same(read(pool0, m.indices), rows[2][0]) and same(read(pool1, m.indices), rows[2][1])
    assert tree.hstats.peer_missing_pages == 0

    # the later stage's pages corrupted: stage 0 can read its own, but nobody loads them
    for root, _, files in os.walk(tiers.storage.root):
        for f in files:
            with open(os.path.join(root, f), "r+b") as fh:
                fh.seek(-1, os.SEEK_END)
                b = fh.read(1)[0]
                fh.seek(-1, os.SEEK_END)
                fh.write(bytes([b ^ 0x5A]))
    tree, alloc, pool0, pool1, tiers = two_stages(d)
    assert tree.match_and_load(seqs[3] + [7]).prefix_len == 0
    tiers.apply(tree.take_ops())
    assert tree.hstats.peer_missing_pages == 2 and tree.hstats.peer_read_failures == 1
    assert tree.storage.stats.read_failures == 0 and tiers.staged == {}
    assert alloc.available_size() == alloc.size
