"""The DSA KV pool with `--kv-cache-dtype fp8_e4m3`: latent rows in 1 byte and the Lightning
Indexer's keys as DeepSeek-V3.2 keeps them (float8_e4m3fn, one float32 scale per 128 values), codes
and scales of a token in one uint8 row.

- bytes per token are half the bf16 pool's (up to the 4-byte scale per token and layer);
- stored keys read back (views, widened rows, CP's `round_as_stored`) as an independent rounding
  gives them; the int8 copy (int8 index scoring) is quantized from the stored keys;
- PD transfer regions and HiCache pages carry the index-key rows as stored (uint8), and a sender
  and receiver with different index-key dtypes are refused.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from sglang.srt.mem_cache.hicache.host_pool import TokenLayout, kv_token_buffers
from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool
from sglang.srt.mem_cache.transfer_layout import copy_plan, kv_regions, registration_ranges, slot_runs

FP8 = torch.float8_e4m3fn
L, R, LAYERS = 32, 16, 2  # tiny latent dims


def _rounded(k: torch.Tensor) -> torch.Tensor:
    """Independent DeepSeek-style rounding: per 128 values scale = max(amax, 1e-4) / 448."""
    out = torch.empty_like(k, dtype=torch.float32)
    for b0 in range(0, k.shape[1], 128):
        blk = k[:, b0 : b0 + 128].float()
        scale = blk.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4) / 448.0
        out[:, b0 : b0 + 128] = (blk / scale).to(FP8).float() * scale
    return out


def _pool(dim: int, kv_dtype=FP8, dtype=torch.float32, **kw) -> DSATokenToKVPool:
    return DSATokenToKVPool(40, 4, dtype, L, R, dim, LAYERS, kv_dtype=kv_dtype, **kw)


def test_bytes_per_token_halve_against_bf16():
    """DeepSeek-V3.2's dims (61 layers): 576 latent + 128 index values, 2 bytes each in bf16; 1 byte
    each plus one 4-byte scale per token and layer in FP8."""
    bf16 = DSATokenToKVPool.cell_size_bytes(512, 64, 61, torch.bfloat16, 128)
    fp8 = DSATokenToKVPool.cell_size_bytes(512, 64, 61, torch.bfloat16, 128, kv_dtype=FP8)
    assert bf16 == (576 + 128) * 2 * 61 and fp8 == (576 + 128 + 4) * 61
    assert fp8 * 2 <= bf16 * 1.006
    for dim in (32, 160):  # a real pool's bytes match its per-token size (code bytes padded to 4)
        pool = _pool(dim, dtype=torch.bfloat16)
        wide = _pool(dim, kv_dtype=torch.bfloat16, dtype=torch.bfloat16)
        per_token = DSATokenToKVPool.cell_size_bytes(L, R, LAYERS, torch.bfloat16, dim, kv_dtype=FP8)
        assert pool.mem_bytes() == per_token * (40 + 4)
        assert pool.mem_bytes() * 2 <= wide.mem_bytes() * (1 + 8 / (L + R + dim))


@pytest.mark.parametrize("dim", [32, 72, 160])
def test_stored_index_keys_read_back_as_rounded(dim):
    pool = _pool(dim, index_k_int8=True)
    assert pool.index_k_fp8 and pool.index_k_buffer[0].dtype == torch.uint8
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(6, dim, generator=g) * torch.tensor([0.01, 1, 30, 1e-6, 2, 5]).unsqueeze(1)
    slots = torch.tensor([4, 5, 9, 10, 20, 41])
    pool.set_index_k_buffer(1, slots, keys)
    want = _rounded(keys)
    torch.testing.assert_close(pool.index_k_rows(1, slots), want, atol=0, rtol=0)
    codes, scales = pool.get_index_k_fp8(1)
    assert codes.dtype == FP8 and scales.shape == (44, -(-dim // 128))
    top = codes[slots].float().abs().amax(dim=1)  # each row's range used, but below the 1e-4 floor
    assert top.tolist()[:3] + top.tolist()[4:] == [448.0] * 5 and float(top[3]) < 448
    rows = torch.cat([torch.randn(6, L + R, generator=g), keys], dim=1)
    torch.testing.assert_close(pool.round_as_stored(1, rows)[:, L + R :], want, atol=0, rtol=0)
    from sgl_kernel_npu.reference import quantize_int8

    k8, s8 = pool.get_index_k_int8(1)
    want8, want_s = quantize_int8(want)
    assert torch.equal(k8[slots], want8) and torch.equal(s8[slots], want_s)
    assert pool.index_k_rows(0, slots).abs().max() == 0  # the other layer untouched


def test_index_keys_follow_the_kv_dtype_unless_told():
    assert not _pool(32, kv_dtype=None).index_k_fp8
    assert _pool(32, kv_dtype=torch.float8_e5m2).index_k_fp8  # e4m3 index keys with e5m2 latent rows
    pool = _pool(32, kv_dtype=None, index_k_fp8=True)  # FP8 index keys beside a float32 latent cache
    assert pool.index_k_buffer[0].dtype == torch.uint8 and pool.kv_buffer[0].dtype == torch.float32
    keys = torch.randn(3, 32)
    pool.set_index_k_buffer(0, torch.tensor([1, 2, 3]), keys)
    torch.testing.assert_close(pool.index_k_rows(0, torch.tensor([1, 2, 3])), _rounded(keys), atol=0, rtol=0)
    size = DSATokenToKVPool.cell_size_bytes(L, R, LAYERS, torch.float32, 32, index_k_fp8=True)
    assert size == ((L + R) * 4 + 32 + 4) * LAYERS


def _filled(pool: DSATokenToKVPool, seed: int) -> DSATokenToKVPool:
    g = torch.Generator().manual_seed(seed)
    for layer in range(LAYERS):
        slots = torch.arange(4, 36)
        pool.set_kv_buffer(layer, slots, torch.randn(32, L + R, generator=g))
        pool.set_index_k_buffer(layer, slots, torch.randn(32, pool.index_head_dim, generator=g))
    return pool


def test_pd_transfer_moves_index_keys_as_stored():
    src, dst = _filled(_pool(72), 0), _pool(72)
    regions = kv_regions(src)
    index = [r for r in regions if r.kind == "index_k"]
    assert len(index) == LAYERS and all(r.dtype == "uint8" and r.slot_bytes == 72 + 4 for r in index)
    assert sum(n for _, n in registration_ranges(regions)) == src.mem_bytes()  # every byte, once
    src_slots, dst_slots = np.array([5, 6, 7, 20]), np.array([9, 10, 11, 30])
    for s, d, n in zip(*copy_plan(regions, kv_regions(dst), slot_runs(src_slots, dst_slots))):
        ctypes.memmove(d, s, n)
    for layer in range(LAYERS):
        got = dst.index_k_rows(layer, torch.from_numpy(dst_slots))
        assert torch.equal(got, src.index_k_rows(layer, torch.from_numpy(src_slots)))
        assert torch.equal(
            dst.kv_buffer[layer][dst_slots].view(torch.uint8),
            src.kv_buffer[layer][src_slots].view(torch.uint8),
        )
    with pytest.raises(ValueError, match="KV layout mismatch"):  # the other side keeps model-dtype keys
        copy_plan(
            regions, kv_regions(_pool(72, kv_dtype=None, index_k_fp8=False)), slot_runs(src_slots, dst_slots)
        )


def test_hicache_pages_carry_index_keys_as_stored():
    pool = _filled(_pool(32), 1)
    buffers = kv_token_buffers(pool)
    layout = TokenLayout(buffers)
    assert layout.token_bytes() == pool.cell_size_bytes(L, R, LAYERS, torch.float32, 32, kv_dtype=FP8)
    slots = torch.tensor([4, 5, 9])
    host = [torch.zeros_like(b) for b in buffers]
    layout.unpack_into(host, torch.tensor([1, 2, 3]), layout.pack(buffers, slots))
    for b, h in zip(buffers, host):
        assert torch.equal(b[slots].view(torch.uint8), h[1:4].view(torch.uint8))


def test_dsa_backend_hands_the_ops_views_of_the_pool():
    """The `dsa` backend's PA_BSND blocks of the FP8 codes and their scales (pages of 4) are views
    of the pool's uint8 rows, and so are the ops' canonical rows: the kernels read it in place."""
    from sgl_kernel_npu.layouts import canonical_keys

    from sglang.srt.layers.attention.dsa_backend import DSAPaged

    pool = DSATokenToKVPool(64, 4, torch.float32, L, R, 72, 1, kv_dtype=FP8)
    codes, scales = pool.get_index_k_fp8(0)
    paged = DSAPaged(None, None, None, 4, False)
    keys = canonical_keys(
        paged.blocks(codes),
        "PA_BSND",
        torch.tensor([5]),
        torch.zeros((1, 2), dtype=torch.int32),
        1,
        paged.blocks(scales),
    )
    base = pool.index_k_buffer[0].data_ptr()
    assert keys.rows.data_ptr() == base and keys.scale.data_ptr() == base + 72
    assert keys.rows.stride(0) == 76 and keys.scale.stride(0) == 76 // 4
