"""Page runs and copy plans over real KV pools: executing a plan with memmove moves exactly the
chosen slots of every shared layer and head (MHA across different tp splits, MLA / DSA rows)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool
from sglang.srt.mem_cache.transfer_layout import copy_plan, kv_regions, registration_ranges, slot_runs


def run(plan):
    for s, d, n in zip(*plan):
        ctypes.memmove(d, s, n)


def test_slot_runs_merge_consecutive_pairs():
    runs = slot_runs([4, 5, 6, 10, 11, 20], [8, 9, 10, 11, 12, 30])
    assert runs.tolist() == [[4, 8, 3], [10, 11, 2], [20, 30, 1]]
    assert slot_runs([], []).shape == (0, 3)
    with pytest.raises(ValueError):
        slot_runs([1, 2], [3])


def test_mha_full_to_split_heads():
    """Prefill holds heads 0..3 (tp 1); two decode ranks hold heads 0..1 and 2..3 (tp 2)."""
    torch.manual_seed(0)
    src = MHATokenToKVPool(32, 4, torch.float32, head_num=4, head_dim=8, layer_num=3, start_layer=2)
    for t in src.k_head_major + src.v_head_major:
        t.copy_(torch.randn_like(t))
    dsts = [
        MHATokenToKVPool(32, 4, torch.float32, head_num=2, head_dim=8, layer_num=3, start_layer=2)
        for _ in range(2)
    ]
    src_slots = np.array([5, 6, 7, 8, 13, 14])
    dst_slots = np.array([20, 21, 22, 23, 4, 5])
    for r, dst in enumerate(dsts):
        plan = copy_plan(kv_regions(src, 0), kv_regions(dst, 2 * r), slot_runs(src_slots, dst_slots))
        assert len(plan[0]) == 3 * 2 * 2 * 2  # layers x (k, v) x heads x runs
        run(plan)
        for layer in range(2, 5):
            sk, sv = src.get_kv_buffer_head_major(layer)
            dk, dv = dst.get_kv_buffer_head_major(layer)
            assert torch.equal(dk[:, dst_slots], sk[2 * r : 2 * r + 2, src_slots])
            assert torch.equal(dv[:, dst_slots], sv[2 * r : 2 * r + 2, src_slots])
            untouched = np.setdiff1d(np.arange(dk.shape[1]), dst_slots)
            assert not dk[:, untouched].any()


def test_dsa_rows_and_layer_subset():
    """A pipeline stage holding layers 1..2 fills only those layers of a full receiver."""
    src = DSATokenToKVPool(16, 1, torch.float32, 8, 4, 6, layer_num=2, start_layer=1)
    for t in src.kv_buffer + src.index_k_buffer:
        t.copy_(torch.randn_like(t))
    dst = DSATokenToKVPool(16, 1, torch.float32, 8, 4, 6, layer_num=4, start_layer=0)
    s, d = np.array([3, 4, 9]), np.array([10, 11, 1])
    run(copy_plan(kv_regions(src), kv_regions(dst), slot_runs(s, d)))
    for layer in (1, 2):
        assert torch.equal(dst.get_key_buffer(layer)[d], src.get_key_buffer(layer)[s])
        assert torch.equal(dst.get_index_k_buffer(layer)[d], src.get_index_k_buffer(layer)[s])
    for layer in (0, 3):
        assert not dst.get_key_buffer(layer).any() and not dst.get_index_k_buffer(layer).any()


def test_dsa_int8_index_key_copy_is_transferred():
    """With int8 index scoring the pool's int8 index keys and their scales travel with the rows."""
    src = DSATokenToKVPool(16, 1, torch.float32, 8, 4, 6, layer_num=1, index_k_int8=True)
    src.set_index_k_buffer(0, torch.arange(17), torch.randn(17, 6))
    dst = DSATokenToKVPool(16, 1, torch.float32, 8, 4, 6, layer_num=1, index_k_int8=True)
    s, d = np.array([3, 4, 9]), np.array([10, 11, 1])
    run(copy_plan(kv_regions(src), kv_regions(dst), slot_runs(s, d)))
    (s8, s_scale), (d8, d_scale) = src.get_index_k_int8(0), dst.get_index_k_int8(0)
    assert torch.equal(d8[d], s8[s]) and torch.equal(d_scale[d], s_scale[s]) and bool(d_scale[d].all())
    assert sum(n for _, n in registration_ranges(kv_regions(dst))) == dst.mem_bytes()
    plain = DSATokenToKVPool(16, 1, torch.float32, 8, 4, 6, layer_num=1)
    with pytest.raises(ValueError, match="SGLANG_DSA_INDEX_SCORE_DTYPE"):
        copy_plan(kv_regions(plain), kv_regions(dst), slot_runs(s, d))
    copy_plan(kv_regions(src), kv_regions(plain), slot_runs(s, d))  # a receiver without the copy ignores it


def test_layout_mismatch_is_an_error():
    a = MHATokenToKVPool(8, 1, torch.float32, 2, 8, 1)
    b = MHATokenToKVPool(8, 1, torch.bfloat16, 2, 8, 1)
    with pytest.raises(ValueError, match="layout mismatch"):
        copy_plan(kv_regions(a), kv_regions(b), slot_runs([1], [1]))


def test_registration_covers_every_buffer_once():
    pool = MHATokenToKVPool(8, 1, torch.float32, 2, 8, 3)
    ranges = registration_ranges(kv_regions(pool))
    assert len(ranges) == 6 and sum(n for _, n in ranges) == pool.mem_bytes()
