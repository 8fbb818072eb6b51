import pytest
import torch

from sglang.srt.mem_cache.kv_pool import KVPool, MHATokenToKVPool


def test_base_is_abstract():
    with pytest.raises(TypeError):
        KVPool(8, 1, torch.float32, 1)  # type: ignore[abstract]


def test_buffer_shapes_and_mem_bytes():
    pool = MHATokenToKVPool(size=16, page_size=4, dtype=torch.float32, head_num=2, head_dim=8, layer_num=3)
    assert len(pool.k_buffer) == len(pool.v_buffer) == 3
    for i in range(3):
        k, v = pool.get_kv_buffer(i)
        assert k.shape == (20, 2, 8) and v.shape == (20, 2, 8)
        assert k.dtype == torch.float32
        assert k is pool.get_key_buffer(i) and v is pool.get_value_buffer(i)
    cell = MHATokenToKVPool.cell_size_bytes(2, 8, 3, torch.float32)
    assert cell == 2 * 8 * 2 * 3 * 4
    assert pool.mem_bytes() == cell * 20
    assert MHATokenToKVPool.cell_size_bytes(2, 8, 3, torch.bfloat16) == cell // 2


def test_set_kv_buffer_writes_and_casts():
    pool = MHATokenToKVPool(8, 1, torch.bfloat16, head_num=2, head_dim=4, layer_num=2)
    loc = torch.tensor([3, 1, 7])
    k = torch.randn(3, 2, 4, dtype=torch.float32)
    v = torch.randn(3, 8, dtype=torch.float32)  # flat [n, H*D] is accepted too
    pool.set_kv_buffer(1, loc, k, v)
    kb, vb = pool.get_kv_buffer(1)
    assert kb.dtype == torch.bfloat16
    torch.testing.assert_close(kb[loc].float(), k.to(torch.bfloat16).float())
    torch.testing.assert_close(vb[loc].float(), v.view(3, 2, 4).to(torch.bfloat16).float())
    # Other slots and the other layer untouched.
    assert kb[0].abs().sum() == 0 and kb[2].abs().sum() == 0
    assert pool.get_key_buffer(0).abs().sum() == 0


def test_start_layer_uses_global_ids():
    pool = MHATokenToKVPool(4, 1, torch.float32, 1, 2, layer_num=2, start_layer=5)
    pool.set_kv_buffer(6, torch.tensor([1]), torch.ones(1, 1, 2), torch.full((1, 1, 2), 2.0))
    assert pool.k_buffer[1][1].tolist() == [[1.0, 1.0]]
    assert pool.get_value_buffer(6)[1].tolist() == [[2.0, 2.0]]
    with pytest.raises(IndexError):
        pool.get_key_buffer(4)
    with pytest.raises(IndexError):
        pool.get_key_buffer(7)


def test_v_head_dim():
    pool = MHATokenToKVPool(4, 1, torch.float32, 2, 8, 1, v_head_dim=4)
    assert pool.get_value_buffer(0).shape == (5, 2, 4)
    assert MHATokenToKVPool.cell_size_bytes(2, 8, 1, torch.float32, v_head_dim=4) == 2 * 12 * 4
    assert pool.mem_bytes() == 5 * 2 * 12 * 4


def test_mem_cache_layering():
    """mem_cache must not import from managers/ or models/."""
    import pathlib
    import re

    import sglang.srt.mem_cache as pkg

    for path in pathlib.Path(pkg.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"sglang\.srt\.(managers|models)\b", text), path.name


@pytest.mark.parametrize(
    "slots",
    [
        list(range(5, 105)),  # one run: written by slice copies
        list(range(104, 4, -1)),  # same slots, descending: scattered
        list(range(5, 55)) + list(range(56, 106)),  # a gap in the middle
        list(range(10, 30)),  # a run below the slice-copy threshold
    ],
)
def test_set_kv_buffer_runs_match_scattered_writes(slots):
    """Consecutive slots take the slice-copy path; every layer reusing the same `loc` tensor and
    a new tensor with other slots must both land exactly where the scattered write puts them."""
    pool = MHATokenToKVPool(300, 1, torch.float32, head_num=3, head_dim=4, layer_num=2)
    loc = torch.tensor(slots)
    n = len(slots)
    qkv = torch.randn(n, 40)  # k / v as strided column slices of one projection, as in models
    k, v = qkv[:, 8:20], qkv[:, 20:32]
    for layer in (0, 1):
        pool.set_kv_buffer(layer, loc, k, v)
        kb, vb = pool.get_kv_buffer(layer)
        torch.testing.assert_close(kb[loc], k.reshape(n, 3, 4), rtol=0, atol=0)
        torch.testing.assert_close(vb[loc], v.reshape(n, 3, 4), rtol=0, atol=0)
        untouched = torch.ones(301, dtype=torch.bool)
        untouched[loc] = False
        assert kb[untouched].abs().sum() == 0 and vb[untouched].abs().sum() == 0
    other = torch.arange(120, 120 + n)
    pool.set_kv_buffer(0, other, v, k)
    torch.testing.assert_close(pool.get_key_buffer(0)[other], v.reshape(n, 3, 4), rtol=0, atol=0)


def _fused_store():
    from sglang.srt.platforms.kernel_dispatch import kv_store_op

    op = kv_store_op(torch.device("cpu"))
    if op is None:
        pytest.skip("no CPU kernel build here (the fused kv_store)")
    return op


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 5, 300])
def test_fused_store_writes_what_the_torch_path_writes(dtype, n):
    """The kernels' `kv_store` (scattered rows of the pool's dtype, one call): the same buffers as
    the torch path, for [n, H, D] and [n, H * D] inputs, a K slice of a wider (qkv) row, V of
    another head dim; a consecutive run (a fresh prefill) and other dtypes keep the torch path."""
    op = _fused_store()
    g = torch.Generator().manual_seed(n)
    pools = [
        MHATokenToKVPool(400, 1, dtype, head_num=3, head_dim=8, layer_num=2, v_head_dim=4, store_rows=s)
        for s in (None, op)
    ]
    loc = torch.randperm(400, generator=g)[:n] + 1
    qkv = torch.randn(n, 48, generator=g).to(dtype)
    k = qkv[:, 16:40]  # row stride 48: a slice of a fused projection
    v = torch.randn(n, 3, 4, generator=g).to(dtype)
    run = torch.arange(1, n + 1) if n >= 64 else None
    for pool in pools:
        pool.set_kv_buffer(1, loc, k, v)
        pool.set_kv_buffer(0, loc, k.float(), v.float())  # another dtype: cast by the torch path
        if run is not None:
            pool.set_kv_buffer(0, run, k, v)
    for i in range(2):
        assert torch.equal(pools[0].k_head_major[i], pools[1].k_head_major[i])
        assert torch.equal(pools[0].v_head_major[i], pools[1].v_head_major[i])
    assert pools[1].k_head_major[1].abs().sum() > 0


def test_fused_store_refuses_bad_slots_and_shapes():
    op = _fused_store()
    pool = MHATokenToKVPool(8, 1, torch.float32, head_num=2, head_dim=4, layer_num=1, store_rows=op)
    k, v = torch.randn(2, 8), torch.randn(2, 8)
    before = pool.k_head_major[0].clone()
    with pytest.raises(RuntimeError, match="outside the pool"):
        pool.set_kv_buffer(0, torch.tensor([3, 9]), k, v)  # rows 0..8 (size + page)
    assert torch.equal(pool.k_head_major[0], before)  # nothing written before the check
    # layouts the kernel does not take go the torch path: a strided slot list, a transposed K
    ref = MHATokenToKVPool(8, 1, torch.float32, head_num=2, head_dim=4, layer_num=1)
    slots, kt = torch.tensor([5, 0, 2, 0])[::2], torch.randn(8, 2).t()
    for p in (pool, ref):
        p.set_kv_buffer(0, slots, kt, v)
    assert torch.equal(pool.k_head_major[0], ref.k_head_major[0])
    assert torch.equal(pool.v_head_major[0], ref.v_head_major[0])
    with pytest.raises(RuntimeError, match="values a token"):
        op(pool.k_head_major[0], pool.v_head_major[0], torch.tensor([1, 2]), torch.randn(2, 6), v)
    with pytest.raises(RuntimeError, match="contiguous"):
        op(pool.k_head_major[0], pool.v_head_major[0], torch.tensor([1, 2]), torch.randn(8, 2).t(), v)
