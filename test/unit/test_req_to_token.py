import pytest
import torch

from sglang.srt.mem_cache.req_to_token import ReqToTokenPool


def test_shape_dtype_and_initial_state():
    pool = ReqToTokenPool(4, 16)
    assert pool.req_to_token.shape == (4, 16)
    assert pool.req_to_token.dtype == torch.int64
    assert pool.available_size() == 4


def test_alloc_free_accounting():
    pool = ReqToTokenPool(4, 8)
    a = pool.alloc(3)
    assert a is not None and len(a) == 3 and len(set(a)) == 3
    assert all(0 <= r < 4 for r in a)
    assert pool.available_size() == 1
    assert pool.alloc(2) is None
    assert pool.available_size() == 1  # failed alloc takes nothing
    b = pool.alloc()
    assert b is not None and len(b) == 1 and b[0] not in a
    assert pool.available_size() == 0
    pool.free(a[0])
    pool.free([a[1], a[2]])
    assert pool.available_size() == 3
    c = pool.alloc(3)
    assert sorted(c) == sorted(a)


def test_rows_are_writable():
    pool = ReqToTokenPool(2, 8)
    (r,) = pool.alloc(1)
    pool.req_to_token[r, :3] = torch.tensor([5, 6, 7])
    assert pool.req_to_token[r, :3].tolist() == [5, 6, 7]


def test_double_free_raises():
    pool = ReqToTokenPool(3, 4)
    rows = pool.alloc(2)
    pool.free(rows[0])
    with pytest.raises(RuntimeError):
        pool.free(rows[0])
    with pytest.raises(RuntimeError):
        pool.free([rows[1], rows[1]])
    assert pool.available_size() == 2  # failed free changed nothing
    with pytest.raises(RuntimeError):
        pool.free(2 if 2 not in rows else 0)  # never allocated
    with pytest.raises(ValueError):
        pool.free(3)


def test_clear():
    pool = ReqToTokenPool(3, 4)
    pool.alloc(3)
    pool.clear()
    assert pool.available_size() == 3
    assert pool.alloc(3) == [0, 1, 2]
