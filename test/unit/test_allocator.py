import random

import pytest
import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator


def test_page1_alloc_free_accounting():
    a = TokenToKVPoolAllocator(8)
    assert a.size == 8 and a.available_size() == 8
    x = a.alloc(5)
    assert x.dtype == torch.int64 and x.numel() == 5
    assert 0 not in x.tolist() and len(set(x.tolist())) == 5
    assert all(1 <= s <= 8 for s in x.tolist())
    assert a.available_size() == 3
    assert a.alloc(4) is None
    assert a.available_size() == 3
    y = a.alloc(3)
    assert set(x.tolist()) | set(y.tolist()) == set(range(1, 9))
    assert a.alloc(1) is None
    a.free(x)
    assert a.available_size() == 5
    z = a.alloc(5)
    assert sorted(z.tolist()) == sorted(x.tolist())
    assert a.alloc(0).numel() == 0


def test_page1_extend_and_decode():
    a = TokenToKVPoolAllocator(6)
    out = a.alloc_extend([0, 3], [2, 3], [-1, 4])
    assert out.numel() == 5 and a.available_size() == 1
    assert a.alloc_decode([3, 7], [1, 2]) is None
    assert a.available_size() == 1
    assert a.alloc_decode([3], [1]).numel() == 1


def test_double_free_paged_and_partial_failure_is_atomic():
    a = TokenToKVPoolAllocator(16, page_size=4)
    x = a.alloc(8)  # two pages
    a.free(x[:2])  # frees the whole first page
    assert a.available_size() == 12
    with pytest.raises(RuntimeError, match="double free"):
        a.free(x[2:4])  # same page again
    with pytest.raises(RuntimeError, match="double free"):
        a.free(x)  # first page already free -> nothing freed, not even the second page
    assert a.available_size() == 12
    a.free(x[4:])
    assert a.available_size() == 16
    with pytest.raises(ValueError):
        a.free(torch.tensor([0]))  # padding slot


def test_double_free_slots_page1():
    a = TokenToKVPoolAllocator(8)
    x = a.alloc(3)
    a.free(x[:1])
    with pytest.raises(RuntimeError, match="double free"):
        a.free(x[:1])
    with pytest.raises(RuntimeError, match="double free"):
        a.free(torch.cat([x[1:2], x[1:2]]))
    assert a.available_size() == 6
    a.free(x[1:])
    assert a.available_size() == 8


def test_paged_alloc_whole_pages():
    a = TokenToKVPoolAllocator(16, page_size=4)  # pages 1..4, slots 4..19
    assert a.num_pages == 4 and a.available_size() == 16
    x = a.alloc(6)
    assert x.numel() == 6
    assert a.available_size() == 8  # two pages taken
    pages = (x // 4).tolist()
    assert pages[:4] == [pages[0]] * 4 and pages[4:] == [pages[4]] * 2 and pages[0] != pages[4]
    assert x[:4].tolist() == list(range(pages[0] * 4, pages[0] * 4 + 4))
    assert 0 not in pages and all(4 <= s < 20 for s in x.tolist())
    assert a.alloc(9) is None and a.available_size() == 8


def test_alloc_extend_continues_page():
    a = TokenToKVPoolAllocator(32, page_size=4)
    first = a.alloc_extend([0], [6], [-1])  # positions 0..5: one full page + 2 slots of next
    assert first.numel() == 6 and a.available_size() == 24
    # positions 6..10: 6,7 continue the page of position 5, then 8..10 in a new page.
    nxt = a.alloc_extend([6], [5], [int(first[-1])])
    assert nxt.numel() == 5 and a.available_size() == 20
    assert nxt[:2].tolist() == [int(first[-1]) + 1, int(first[-1]) + 2]
    assert nxt[2] % 4 == 0 and nxt[2:].tolist() == list(range(int(nxt[2]), int(nxt[2]) + 3))
    all_slots = torch.cat([first, nxt])
    assert len(set(all_slots.tolist())) == 11
    # extend that fits entirely in the current page takes no page
    more = a.alloc_extend([11], [1], [int(nxt[-1])])
    assert more.tolist() == [int(nxt[-1]) + 1] and a.available_size() == 20


def test_alloc_extend_batch_and_oom_allocates_nothing():
    a = TokenToKVPoolAllocator(16, page_size=4)  # 4 pages
    out = a.alloc_extend([0, 0], [5, 3], [0, 0])
    assert out.numel() == 8 and a.available_size() == 4  # 2 + 1 pages
    r0, r1 = out[:5], out[5:]
    assert (r0[:4] // 4).unique().numel() == 1 and (r1 // 4).unique().numel() == 1
    # needs 1 page for req0? prefix 5 -> positions 5..7 fit in page, 8 needs a new one; req1 5 more
    # -> 1 in page + 4 new (1 page) => 2 pages > 1 free.
    before = a.available_size()
    assert a.alloc_extend([5, 3], [4, 5], [int(r0[-1]), int(r1[-1])]) is None
    assert a.available_size() == before
    ok = a.alloc_extend([5, 3], [3, 1], [int(r0[-1]), int(r1[-1])])  # no new page needed
    assert ok.tolist() == [int(r0[-1]) + i for i in (1, 2, 3)] + [int(r1[-1]) + 1]
    assert a.available_size() == before


def test_alloc_extend_rejects_bad_last_loc():
    a = TokenToKVPoolAllocator(16, page_size=4)
    x = a.alloc(2)
    with pytest.raises(ValueError):
        a.alloc_extend([2], [3], [-1])
    with pytest.raises(ValueError):
        a.alloc_extend([2], [3], [int(x[0])])  # slot of position 0, not 1


def test_alloc_decode_paged():
    a = TokenToKVPoolAllocator(16, page_size=4)
    x = a.alloc(4)  # positions 0..3 fill one page
    y = a.alloc(3)  # positions 0..2 of another request
    assert a.available_size() == 8
    # req A adds position 4 (seq_len 5) -> new page; req B adds position 3 (seq_len 4) -> same page
    d = a.alloc_decode([5, 4], [int(x[-1]), int(y[-1])])
    assert a.available_size() == 4
    assert d[0] % 4 == 0 and (d[0] // 4) not in ((x // 4).tolist() + (y // 4).tolist())
    assert d[1] == y[-1] + 1
    # OOM: needs two new pages, one free -> None, nothing taken
    # B position 4 needs a page, A position 5 continues A's page
    d2 = a.alloc_decode([5, 6], [int(d[1]), int(d[0])])
    assert d2 is not None and d2[0] % 4 == 0 and d2[1] == d[0] + 1
    assert a.available_size() == 0
    # A position 6 still fits; a new request C (position 0) needs a page -> whole call fails
    assert a.alloc_decode([7, 1], [int(d2[1]), -1]) is None
    assert a.available_size() == 0
    assert a.alloc_decode([7], [int(d2[1])]).tolist() == [int(d2[1]) + 1]
    with pytest.raises(ValueError):
        a.alloc_decode([6], [int(d[0]) + 2])  # not the slot of position 4


def test_free_group():
    a = TokenToKVPoolAllocator(8)
    x = a.alloc(4)
    a.free_group_begin()
    a.free(x[:2])
    a.free(x[2:])
    assert a.available_size() == 4
    a.free_group_end()
    assert a.available_size() == 8


def test_clear():
    a = TokenToKVPoolAllocator(16, page_size=4)
    a.alloc(10)
    a.clear()
    assert a.available_size() == 16
    assert a.alloc(16) is not None


@pytest.mark.parametrize("page_size", [1, 4])
def test_randomized_requests_keep_page_invariants(page_size):
    """Grow random requests by extend/decode, free some; check ownership and page continuity."""
    rng = random.Random(1234 + page_size)
    a = TokenToKVPoolAllocator(128, page_size=page_size)
    reqs: dict[int, list[int]] = {}
    next_id = 0
    for _ in range(300):
        op = rng.random()
        if op < 0.3 or not reqs:
            ids = [next_id, next_id + 1]
            next_id += 2
            for i in ids:
                reqs[i] = []
            chosen = ids
        else:
            chosen = rng.sample(sorted(reqs), k=min(len(reqs), rng.randint(1, 3)))
        if op < 0.8:
            ext = [rng.randint(1, 7) for _ in chosen]
            pre = [len(reqs[i]) for i in chosen]
            last = [reqs[i][-1] if reqs[i] else -1 for i in chosen]
            before = a.available_size()
            out = a.alloc_extend(pre, ext, last)
            if out is None:
                assert a.available_size() == before
            else:
                parts = torch.split(out, ext)
                for i, p in zip(chosen, parts):
                    reqs[i].extend(p.tolist())
        elif op < 0.9:
            seq = [len(reqs[i]) + 1 for i in chosen]
            last = [reqs[i][-1] if reqs[i] else -1 for i in chosen]
            out = a.alloc_decode(seq, last)
            if out is not None:
                for i, s in zip(chosen, out.tolist()):
                    reqs[i].append(s)
        else:
            for i in chosen:
                if reqs[i]:
                    a.free(torch.tensor(reqs[i]))
                del reqs[i]
        # invariants
        live = [s for r in reqs.values() for s in r]
        assert len(live) == len(set(live)) and 0 not in live
        owned_pages = [set(s // page_size for s in r) for r in reqs.values()]
        for r in reqs.values():
            for pos in range(1, len(r)):
                if pos % page_size:
                    assert r[pos] == r[pos - 1] + 1  # same page, next slot
                else:
                    assert r[pos] % page_size == 0
        all_pages = set().union(*owned_pages) if owned_pages else set()
        assert sum(len(p) for p in owned_pages) == len(all_pages)  # no page shared by two requests
        assert 0 not in all_pages
        used_pages = sum(len(p) for p in owned_pages)
        assert a.available_size() == a.size - used_pages * page_size
    for r in list(reqs.values()):
        if r:
            a.free(torch.tensor(r))
    assert a.available_size() == a.size
