"""Warming the KV pool's first slots (mem_cache/kv_warm.py): the byte ranges a pool reports for a
slot range are exactly those slots' bytes in every buffer (head-major MHA, MLA latent); the warmer
commits them with the CPU platform's real `madvise(MADV_POPULATE_WRITE)` (resident size grows by
their bytes, contents unchanged, KV written before kept); it stops when populating fails; a zero
budget or a platform without lazy pools starts nothing."""

from __future__ import annotations

import logging

import pytest
import torch

from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.kv_warm import KVWarmer, start_kv_warmer
from sglang.srt.mem_cache.mla_kv_pool import MLATokenToKVPool
from sglang.srt.platforms import get_platform


def _marked(pool, lo: int, hi: int) -> list[torch.Tensor]:
    """Per buffer: a bool per slot row, True where warm_ranges(lo, hi) covers every byte of it."""
    marks = {id(b): torch.zeros(b.untyped_storage().nbytes(), dtype=torch.bool) for b, _ in pool._buffers}
    for buf, start, nbytes in pool.warm_ranges(lo, hi):
        marks[id(buf)][start : start + nbytes] = True
    out = []
    for buf, dim in pool._buffers:
        m = marks[id(buf)]
        size = buf.element_size()
        row = buf.stride(dim) * size
        heads = buf.shape[0] if dim == 1 else 1
        per_head = m[: heads * buf.stride(0) * size if dim == 1 else None]
        if dim == 1:
            per_row = per_head.view(heads, buf.shape[1], row).all(dim=2).all(dim=0)
            assert m.sum() == per_row.sum() * row * heads
        else:
            per_row = m[: buf.shape[0] * row].view(buf.shape[0], row).all(dim=1)
            assert m.sum() == per_row.sum() * row
        out.append(per_row)
    return out


@pytest.mark.parametrize(
    "make",
    [
        lambda: MHATokenToKVPool(100, 1, torch.bfloat16, head_num=3, head_dim=8, layer_num=2),
        lambda: MHATokenToKVPool(96, 4, torch.float32, head_num=2, head_dim=4, layer_num=1, v_head_dim=6),
        lambda: MLATokenToKVPool(50, 1, torch.bfloat16, kv_lora_rank=16, qk_rope_head_dim=4, layer_num=3),
    ],
)
def test_ranges_cover_exactly_the_slots(make):
    pool = make()
    assert pool.slot_bytes() == sum(
        b.stride(d) * b.element_size() * (b.shape[0] if d == 1 else 1) for b, d in pool._buffers
    )
    for lo, hi in ((0, 10), (7, 33), (90, 10_000)):
        for rows in _marked(pool, lo, hi):
            want = torch.zeros_like(rows)
            want[lo : min(hi, rows.numel())] = True
            assert torch.equal(rows, want), (lo, hi)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_warmer_commits_the_first_slots_and_keeps_contents():
    populate = get_platform("cpu").page_populator()
    pool = MHATokenToKVPool(
        200_000, 1, torch.bfloat16, head_num=2, head_dim=64, layer_num=2
    )  # ~195 MiB, lazy
    k = torch.randn(5, 2, 64).bfloat16()
    pool.set_kv_buffer(0, torch.arange(1, 6), k, k)
    budget = 100_000 * pool.slot_bytes()  # half the pool
    before = _rss()
    warmer = KVWarmer(pool, populate, budget, round_slots=30_000)
    warmer.run()
    grown = _rss() - before
    if warmer.warmed == 0:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    assert warmer.warmed == 100_000
    assert 0.9 * budget <= grown <= 1.2 * budget  # the first half of every buffer, not the rest
    assert torch.equal(pool.get_key_buffer(0)[1:6], k) and torch.equal(pool.get_value_buffer(0)[1:6], k)
    assert pool.get_key_buffer(1).abs().sum() == 0 and pool.get_value_buffer(0)[6:].abs().sum() == 0


def test_warmer_stops_when_populating_fails(caplog):
    pool = MHATokenToKVPool(1000, 1, torch.float32, head_num=1, head_dim=4, layer_num=1)
    calls = []

    def refuse(buf, start, nbytes):
        calls.append(nbytes)
        return False

    with caplog.at_level(logging.INFO):
        warmer = KVWarmer(pool, refuse, 1 << 30, round_slots=100)
        warmer.run()
    assert warmer.warmed == 0 and len(calls) == 1 and "cannot populate" in caplog.text


def test_background_thread_and_what_starts_nothing():
    pool = MHATokenToKVPool(5000, 1, torch.float32, head_num=2, head_dim=4, layer_num=2)
    seen = []
    warmer = start_kv_warmer(pool, lambda b, s, n: seen.append((s, n)) or True, 1.0)
    warmer.stop(timeout=10)
    assert warmer.warmed == warmer.slots == 5001 and sum(n for _, n in seen) == 5001 * pool.slot_bytes()
    assert start_kv_warmer(pool, lambda *a: True, 0) is None
    assert start_kv_warmer(pool, None, 2.0) is None  # accelerator pools: nothing to warm
    assert start_kv_warmer(object(), lambda *a: True, 2.0) is None
