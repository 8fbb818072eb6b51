"""CPU pools come from anonymous maps (platforms/host_memory.py): zero, page-aligned, writable, and
their pages are committed only when written, so a server start does not write the whole KV pool."""

import gc

import pytest
import torch

from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool
from sglang.srt.platforms.host_memory import LAZY_ZERO_MIN_BYTES, lazy_zeros


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int8])
def test_lazy_zeros_is_zero_aligned_and_writable(dtype):
    shape = (2, LAZY_ZERO_MIN_BYTES // 2, 3)
    t = lazy_zeros(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
    assert t.data_ptr() % 4096 == 0
    assert not t.float().any()
    t[1, 7] = 2
    gc.collect()  # the map lives as long as the tensor, not as long as a Python name for it
    assert t.float().sum().item() == 6


def test_small_buffers_are_plain_zeros():
    t = lazy_zeros((4, 8), torch.float32)
    assert t.shape == (4, 8) and not t.any()


def test_a_kv_pool_costs_ram_as_it_fills_not_at_start():
    before = _rss_bytes()
    pool = MHATokenToKVPool(
        size=1 << 17, page_size=16, dtype=torch.float32, head_num=2, head_dim=64, layer_num=8
    )
    pool_bytes = 2 * 8 * 2 * ((1 << 17) + 16) * 64 * 4  # 512 MiB
    assert _rss_bytes() - before < pool_bytes // 8
    loc = torch.tensor([1, 2, 3])
    k = torch.randn(3, 2, 64)
    pool.set_kv_buffer(3, loc, k, -k)
    assert torch.equal(pool.get_key_buffer(3)[loc], k) and torch.equal(pool.get_value_buffer(3)[loc], -k)
    assert not pool.get_key_buffer(3)[4:].any() and not pool.get_key_buffer(2).any()


def test_dsa_pool_buffers_are_zero():
    pool = DSATokenToKVPool(
        size=1 << 14,
        page_size=64,
        dtype=torch.bfloat16,
        kv_lora_rank=64,
        qk_rope_head_dim=16,
        index_head_dim=32,
        layer_num=2,
        index_k_int8=True,
    )
    for buf in (pool.get_key_buffer(0), pool.get_index_k_buffer(1), *pool.get_index_k_int8(0)):
        assert not buf.float().any()
