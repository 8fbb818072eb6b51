"""The `dsa` backend's indexer scoring precision: `SGLANG_DSA_INDEX_SCORE_DTYPE` (auto / float32 /
bfloat16 / int8) and the index-key cache's dtype decide it (`backend_names.index_score_dtype`), and
`DSAKernels` hands it to every `lightning_indexer` call (paged selection, CP own-query selection,
CP decode candidates)."""

from __future__ import annotations

import pytest
import torch

import sgl_kernel_npu as skn
from sglang.srt.layers.attention.dsa.backend_names import INDEX_SCORE_DTYPE_ENV, index_score_dtype
from sglang.srt.layers.attention.dsa.kernels import DSAKernels


def test_index_score_dtype_choice(monkeypatch):
    monkeypatch.delenv(INDEX_SCORE_DTYPE_ENV, raising=False)
    assert index_score_dtype(torch.float32) is None  # float32 model: the reference's float32 scores
    assert index_score_dtype(torch.bfloat16) is torch.bfloat16  # a bf16 cache is bf16 scoring already
    monkeypatch.setenv(INDEX_SCORE_DTYPE_ENV, "bfloat16")
    assert index_score_dtype(torch.float32) is torch.bfloat16
    monkeypatch.setenv(INDEX_SCORE_DTYPE_ENV, "float32")
    assert index_score_dtype(torch.bfloat16) is None
    monkeypatch.setenv(INDEX_SCORE_DTYPE_ENV, "int8")
    assert index_score_dtype(torch.float32) is torch.int8 and index_score_dtype(torch.bfloat16) is torch.int8
    monkeypatch.setenv(INDEX_SCORE_DTYPE_ENV, "fp8")
    with pytest.raises(ValueError, match=INDEX_SCORE_DTYPE_ENV):
        index_score_dtype(torch.float32)


def test_kernels_pass_the_score_dtype(monkeypatch):
    seen = []
    real = skn.lightning_indexer

    def spy(*args, **kwargs):
        seen.append(kwargs.get("score_dtype"))
        return real(*args, **kwargs)

    monkeypatch.setattr(skn, "lightning_indexer", spy)
    gen = torch.Generator().manual_seed(0)
    k = DSAKernels("reference", "reference", torch.bfloat16)
    n, heads, dim, total = 6, 4, 16, 20
    q, w = torch.randn(n, heads, dim, generator=gen), torch.randn(n, heads, generator=gen)
    keys = torch.randn(total, dim, generator=gen)
    pos = torch.arange(total - n, total)
    sel = k.own_query_topk(q, w, pos, keys, 8, 0.5)
    # the reference on bf16-rounded inputs picks the same keys
    seen.clear()
    plain = DSAKernels("reference", "reference")
    ref = plain.own_query_topk(q.bfloat16().float(), w, pos, keys.bfloat16().float(), 8, 0.5)
    assert torch.equal(sel.sort(-1).values, ref.sort(-1).values) and seen == [None]
    seen.clear()
    k.own_query_topk(q, w, pos, keys, 8, 0.5)
    table = torch.arange(total, dtype=torch.int32).view(1, total)
    k.select_paged(
        q, w, 0.5, keys.view(total, 1, 1, dim), table, torch.tensor([n]), torch.tensor([total]), 8, False
    )
    slots = torch.arange(total).view(1, total).expand(n, total)
    valid = torch.ones(n, total, dtype=torch.bool)
    k.shard_topk_candidates(q, w, keys, slots, valid, torch.arange(total), 8, 0.5)
    assert seen == [torch.bfloat16] * 3


def test_kernels_read_the_pools_int8_copy_when_scoring_int8():
    from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool

    with_copy = DSATokenToKVPool(8, 1, torch.float32, 4, 2, 6, layer_num=1, index_k_int8=True)
    plain = DSATokenToKVPool(8, 1, torch.float32, 4, 2, 6, layer_num=1)
    for pool in (with_copy, plain):
        pool.set_index_k_buffer(0, torch.arange(3), torch.randn(3, 6))
    keys, scale = DSAKernels("reference", "reference", torch.int8).index_keys(with_copy, 0)
    assert (
        keys.dtype == torch.int8 and keys is with_copy.index_k_int8[0] and scale is with_copy.index_k_scale[0]
    )
    for k, pool in ((DSAKernels("reference", "reference", torch.int8), plain), (DSAKernels(), with_copy)):
        keys, scale = k.index_keys(pool, 0)
        assert keys is pool.get_index_k_buffer(0) and scale is None
