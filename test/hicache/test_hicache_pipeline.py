"""HiCache under pipeline parallelism, in one process: stage 0's tree records its tier copies and a
later stage's `StageTiers` replays them on a KV pool of its own (other layers: other values), as
`managers/pp/hicache_ring.py` does between processes. The ring here is a list (`LocalRing`): the
ops are replayed in order and the storage query goes to the later stage's real I/O thread; its
answer reaches stage 0 only when the test lets it (a ring's round trip).

The later stage's pool must hold its own KV of every prefix the tree loads from L2 or L3; an L3
prefix readable on stage 0 only must not load anywhere, one the later stage read in part loads only
that part; and until the answer is back the request waits and the query's host rows stay reserved
(the later stage may still be writing them)."""

from __future__ import annotations

import os
import time

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.hicache.file_storage import FileStorage
from sglang.srt.mem_cache.hicache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.hicache.host_pool import HostKVPool, kv_token_buffers
from sglang.srt.mem_cache.hicache.pipeline import RingPeers, StageTiers
from sglang.srt.mem_cache.hicache.prefetch import PrefetchConfig
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool

from test_hicache_tiers import PAGE, accounting_ok, fill, read

L1, L2, SP = 16, 32, 4


class LocalRing:
    """Stage 0's `Ring` in one process: `send` replays the ops and hands the query to the later
    stage's I/O thread; `answers` gives what that thread finished, unless `hold` (in transit)."""

    def __init__(self, tiers: StageTiers):
        self.tiers, self.done, self.hold = tiers, [], False

    def send(self, query, ops) -> None:
        self.tiers.apply(ops)
        self.tiers.read(query, self.done.append)

    def answers(self) -> list:
        if self.hold:
            return []
        out = self.done[:]
        del self.done[: len(out)]
        return out

    def wait_read(self, n: int = 1) -> None:
        deadline = time.monotonic() + 10
        while len(self.done) < n:
            assert time.monotonic() < deadline, "the later stage's read did not end"
            time.sleep(0.001)


def two_stages(directory: str, policy: str = "wait_complete"):
    pool0 = MHATokenToKVPool(L1, PAGE, torch.float32, head_num=2, head_dim=4, layer_num=2)
    alloc = TokenToKVPoolAllocator(L1, PAGE)
    host0 = HostKVPool(kv_token_buffers(pool0), L2, PAGE)
    storage0 = FileStorage(directory, "stage0", SP)
    tree = HiRadixCache(alloc, PAGE, host0, "write_through", storage0, None, PrefetchConfig(policy))
    pool1 = MHATokenToKVPool(L1, PAGE, torch.float32, head_num=2, head_dim=4, layer_num=2)
    tiers = StageTiers(HostKVPool(kv_token_buffers(pool1), L2, PAGE), FileStorage(directory, "stage1", SP))
    ring = LocalRing(tiers)
    tree.enable_pipeline(RingPeers(ring))
    return tree, alloc, pool0, pool1, tiers, ring


def micro_batch(tree, tiers, alloc, pools, tokens, seed):
    """Prefill `tokens` on both stages (the stage replays stage 0's ops first) and cache them."""
    if alloc.available_size() < len(tokens):
        tree.evict(len(tokens) - alloc.available_size())
    slots = alloc.alloc(len(tokens))
    tiers.apply(tree.take_ops())
    rows = [fill(pool, slots, seed + 1000 * k) for k, pool in enumerate(pools)]
    assert tree.insert(tokens, slots) == 0
    return rows


def admit(tree, tiers, key, rid="r"):
    """A waiting request: its prefetch, polls until the policy lets it go, admission (the later
    stage replays the admission's copies)."""
    assert tree.wants_prefetch(rid) and tree.prefetch(rid, key)
    deadline = time.monotonic() + 10
    while not tree.prefetch_ready(rid):
        assert time.monotonic() < deadline, "the prefetch never let its request go"
        tree.poll_prefetches([rid])
    m = tree.match_and_load(key, rid)
    tiers.apply(tree.take_ops())
    return m


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def written(d: str):
    """Four 8-token sequences cached through a two-stage tree (twice L1): every page on both stages."""
    tree, alloc, pool0, pool1, tiers, _ = two_stages(d)
    seqs = [list(range(100 * k, 100 * k + 8)) for k in range(1, 5)]
    rows = [micro_batch(tree, tiers, alloc, (pool0, pool1), s, k) for k, s in enumerate(seqs)]
    m = tree.match_and_load(seqs[0] + [7])  # evicted to L2: restored on both stages
    tiers.apply(tree.take_ops())
    assert m.prefix_len == 8 and tree.hstats.l2_hit_tokens == 8
    assert same(read(pool0, m.indices), rows[0][0]) and same(read(pool1, m.indices), rows[0][1])
    assert accounting_ok(tree, alloc)
    return seqs, rows


def corrupt(path: str) -> None:
    with open(path, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        b = fh.read(1)[0]
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([b ^ 0x5A]))


def test_later_stage_mirrors_the_tiers_and_reads_its_own_pages(tmp_path):
    d = str(tmp_path)
    seqs, rows = written(d)
    # a restart: empty L1 / L2 on both stages; each stage reads its own pages of the prefix
    tree, alloc, pool0, pool1, tiers, _ = two_stages(d)
    assert tree.match_and_load(seqs[2] + [7]).prefix_len == 0  # no prefetch: no read on stage 0 alone
    m = admit(tree, tiers, seqs[2] + [7])
    assert m.prefix_len == 8 and tree.hstats.l3_hit_tokens == 8
    assert same(read(pool0, m.indices), rows[2][0]) and same(read(pool1, m.indices), rows[2][1])
    assert tree.hstats.peer_missing_pages == 0 and tree.hstats.peer_read_failures == 0


def test_pages_the_later_stage_cannot_read_are_recomputed_by_all(tmp_path):
    d = str(tmp_path)
    seqs, rows = written(d)
    names = FileStorage(d, "stage1", SP).page_hashes(seqs[3], 2)
    tree, alloc, pool0, pool1, tiers, _ = two_stages(d)
    corrupt(tiers.storage._path(names[1]))  # the later stage reads page 0 of seqs[3] only
    m = admit(tree, tiers, seqs[3] + [7])
    assert m.prefix_len == SP and tree.hstats.l3_hit_tokens == SP
    assert same(read(pool0, m.indices), [r[:SP] for r in rows[3][0]])
    assert same(read(pool1, m.indices), [r[:SP] for r in rows[3][1]])
    assert tree.hstats.peer_missing_pages == 1 and tree.hstats.peer_read_failures == 1
    # every page of the later stage bad: stage 0 can read its own, but nobody loads them
    corrupt(tiers.storage._path(names[0]))
    tree, alloc, pool0, pool1, tiers, _ = two_stages(d)
    assert admit(tree, tiers, seqs[3] + [7]).prefix_len == 0
    assert tree.hstats.peer_missing_pages == 2 and tree.hstats.peer_read_failures == 1
    assert tree.storage.stats.read_failures == 0
    assert alloc.available_size() == alloc.size and tree.host.available_size() == tree.host.size


def test_request_waits_for_the_answer_and_rows_stay_reserved_until_it(tmp_path):
    d = str(tmp_path)
    seqs, _ = written(d)
    tree, alloc, pool0, pool1, tiers, ring = two_stages(d)
    ring.hold = True  # the answer is on its way back
    key = seqs[1] + [7]
    assert tree.prefetch("r", key)
    assert tree.prefetcher.tasks["r"].finished.wait(10)
    ring.wait_read()
    for _ in range(3):  # stage 0 read every page, the later stage too: no answer, no admission
        tree.poll_prefetches(["r"])
        assert not tree.prefetch_ready("r")
    tree.end_prefetch("r")  # an abort: the later stage may still write the rows, so they stay
    tree.poll_prefetches()
    assert tree.host.available_size() == tree.host.size - 8
    ring.hold = False
    tree.poll_prefetches()  # the answer: now every thread has let go of the rows
    assert tree.host.available_size() == tree.host.size and tree.prefetcher.queries == {}
    # the same prompt again: admitted from storage once answered
    m = admit(tree, tiers, key, "r2")
    assert m.prefix_len == 8 and tree.hstats.l3_hit_tokens == 8 and accounting_ok(tree, alloc)


def test_flush_waits_for_answers_in_flight(tmp_path):
    d = str(tmp_path)
    seqs, _ = written(d)
    tree, alloc, _, _, tiers, ring = two_stages(d)
    assert tree.prefetch("r", seqs[0] + [7])
    ring.wait_read()
    tree.end_prefetch("r")
    tree.reset()  # `drain`: takes the answer before the host tier is cleared
    assert tree.prefetcher.queries == {} and tree.host.available_size() == tree.host.size
