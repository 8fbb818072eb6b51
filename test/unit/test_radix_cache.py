import random

import pytest
import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache


def make(size=64, page_size=1, disable=False):
    alloc = TokenToKVPoolAllocator(size, page_size=page_size)
    return alloc, RadixCache(alloc, page_size=page_size, disable=disable)


def put(alloc, cache, key):
    """Caller-side insert: reuse cached prefix, allocate the rest, free duplicates and the tail."""
    m = cache.match_prefix(key)
    new = alloc.alloc(len(key) - m.prefix_len)
    assert new is not None
    value = torch.cat([m.indices, new])
    done = cache.insert(key, value)
    assert done == m.prefix_len
    aligned = len(key) // cache.page_size * cache.page_size
    if aligned < len(key):
        alloc.free(value[aligned:])
    return value[:aligned]


def test_insert_and_match():
    alloc, cache = make()
    v = alloc.alloc(3)
    assert cache.insert([1, 2, 3], v) == 0
    assert cache.total_size() == 3 and cache.evictable_size() == 3 and cache.protected_size() == 0
    m = cache.match_prefix([1, 2, 3, 4])
    assert m.indices.tolist() == v.tolist() and m.indices.dtype == torch.int64
    assert m.last_node.key == (1, 2, 3)
    assert cache.match_prefix([2, 3]).indices.numel() == 0
    assert cache.match_prefix([]).indices.numel() == 0
    assert cache.match_prefix([7]).last_node is cache.root_node


def test_match_splits_node():
    alloc, cache = make()
    v = alloc.alloc(4)
    cache.insert([1, 2, 3, 4], v)
    m = cache.match_prefix([1, 2, 9])
    assert m.indices.tolist() == v[:2].tolist()
    assert m.last_node.key == (1, 2) and len(m.last_node.children) == 1
    (child,) = m.last_node.children.values()
    assert child.key == (3, 4) and child.value.tolist() == v[2:].tolist()
    assert cache.total_size() == 4 and cache.evictable_size() == 4
    assert cache.match_prefix([1, 2, 3, 4]).indices.tolist() == v.tolist()


def test_insert_returns_existing_prefix_len():
    alloc, cache = make()
    cache.insert([1, 2, 3], alloc.alloc(3))
    v2 = alloc.alloc(4)
    assert cache.insert([1, 2, 3, 4], v2) == 3
    alloc.free(v2[:3])  # the caller frees its duplicates
    v3 = alloc.alloc(3)
    assert cache.insert([1, 2, 5], v3) == 2
    alloc.free(v3[:2])
    assert cache.insert([1, 2, 3, 4], v2.clone()) == 4  # nothing new
    assert cache.total_size() == 5 and cache.evictable_size() == 5
    m = cache.match_prefix([1, 2, 3, 4])
    assert m.indices[3] == v2[3]
    assert cache.match_prefix([1, 2, 5]).indices[2] == v3[2]
    assert alloc.available_size() == 64 - 5


def test_insert_value_length_must_match():
    alloc, cache = make()
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3], alloc.alloc(2))


def test_paged_matching():
    alloc, cache = make(64, page_size=4)
    key = list(range(10))
    cached = put(alloc, cache, key)
    assert cached.numel() == 8 and cache.total_size() == 8
    assert alloc.available_size() == 64 - 8  # tail page was freed by the caller
    assert cache.match_prefix(key).indices.tolist() == cached.tolist()
    assert cache.match_prefix(key[:7]).indices.tolist() == cached[:4].tolist()
    assert cache.match_prefix(key[:3]).indices.numel() == 0
    # a mismatch inside the second page only matches the first page (and splits at 4)
    m = cache.match_prefix([0, 1, 2, 3, 4, 99, 6, 7])
    assert m.indices.tolist() == cached[:4].tolist() and m.last_node.key == (0, 1, 2, 3)
    # a mismatch inside the first page matches nothing
    assert cache.match_prefix([0, 1, 2, 99, 4, 5, 6, 7]).indices.numel() == 0
    # both branches coexist; children are keyed by whole pages
    other = put(alloc, cache, [0, 1, 2, 3, 4, 99, 6, 7])
    assert other[:4].tolist() == cached[:4].tolist()
    assert cache.total_size() == 12 and len(m.last_node.children) == 2
    assert all(len(k) == 4 for k in m.last_node.children)
    assert cache.evict(100) == 12
    assert alloc.available_size() == 64


def test_lock_prevents_eviction_and_sizes():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3, 4])
    put(alloc, cache, [1, 2, 7])
    m = cache.match_prefix([1, 2, 3, 4])
    cache.inc_lock_ref(m.last_node)
    assert cache.protected_size() == 4 and cache.evictable_size() == 1
    assert cache.evict(10) == 1
    assert cache.total_size() == 4 and cache.evictable_size() == 0
    assert cache.match_prefix([1, 2, 3, 4]).indices.numel() == 4
    cache.inc_lock_ref(m.last_node)
    cache.dec_lock_ref(m.last_node)
    assert cache.protected_size() == 4  # still locked once
    cache.dec_lock_ref(m.last_node)
    assert cache.protected_size() == 0 and cache.evictable_size() == 4
    with pytest.raises(RuntimeError):
        cache.dec_lock_ref(m.last_node)
    assert cache.evict(10) == 4
    assert alloc.available_size() == 64


def test_split_keeps_lock():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3, 4])
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)
    cache.match_prefix([1, 2])  # split a locked node
    assert cache.protected_size() == 4 and cache.evictable_size() == 0
    assert cache.evict(4) == 0
    cache.dec_lock_ref(node)
    assert cache.evictable_size() == 4 and cache.evict(4) == 4


def test_lru_eviction_order():
    alloc, cache = make()
    a = put(alloc, cache, [1, 1])
    b = put(alloc, cache, [2, 2])
    c = put(alloc, cache, [3, 3])
    cache.match_prefix([1, 1])  # A becomes most recently used
    before = alloc.available_size()
    assert cache.evict(1) == 2  # whole leaf B
    assert alloc.available_size() == before + 2
    assert cache.match_prefix([2, 2]).indices.numel() == 0
    assert cache.match_prefix([3, 3]).indices.tolist() == c.tolist()  # touches C
    assert cache.evict(2) == 2  # A is now the least recent
    assert cache.match_prefix([1, 1]).indices.numel() == 0
    assert cache.match_prefix([3, 3]).indices.numel() == 2
    assert a.numel() == b.numel() == 2


def test_parent_becomes_evictable_and_frees_exact_slots():
    alloc, cache = make(32)
    put(alloc, cache, [1, 2, 3])
    put(alloc, cache, [1, 2, 4, 5])
    put(alloc, cache, [9])
    assert cache.total_size() == 6 and alloc.available_size() == 26
    freed = cache.evict(4)
    assert freed >= 4
    assert alloc.available_size() == 26 + freed
    assert cache.total_size() == 6 - freed == cache.evictable_size()
    assert cache.evict(100) == 6 - freed
    assert cache.total_size() == 0 and alloc.available_size() == 32
    assert not cache.root_node.children


def test_reset_frees_nothing():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    cache.reset()
    assert cache.total_size() == 0 and cache.evictable_size() == 0
    assert cache.match_prefix([1, 2, 3]).indices.numel() == 0
    assert alloc.available_size() == 61  # caller flushes with allocator.clear()


def test_disable_mode():
    alloc, cache = make(disable=True)
    v = alloc.alloc(3)
    assert cache.insert([1, 2, 3], v) == 0
    m = cache.match_prefix([1, 2, 3])
    assert m.indices.numel() == 0 and m.last_node is cache.root_node
    cache.inc_lock_ref(m.last_node)
    cache.dec_lock_ref(m.last_node)
    assert cache.total_size() == 0 and cache.evict(10) == 0
    assert alloc.available_size() == 61


def test_pretty_print(capsys):
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    text = cache.pretty_print()
    assert "[1, 2, 3]" in text and "total=3" in capsys.readouterr().out


def _tree_prefixes(cache):
    """All page-aligned prefixes stored in the tree, mapped to their last page's slots."""
    ps, out = cache.page_size, {}
    stack = [(cache.root_node, ())]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            p = path + child.key
            for k in range(len(path) + ps, len(p) + 1, ps):
                out[p[:k]] = child.value[k - len(path) - ps : k - len(path)].tolist()
            stack.append((child, p))
    return out


def _insert_fresh(alloc, cache, key: list, expect: int, ps: int) -> bool:
    """Insert `key` on fresh slots for all of it (the tree already holds `expect` tokens, which the
    caller frees, as it frees the unaligned tail); False when the allocator is out of slots."""
    v = alloc.alloc(len(key))
    if v is None:
        return False
    assert cache.insert(key, v) == expect
    aligned = len(key) // ps * ps
    if expect:
        alloc.free(v[:expect])
    if aligned < len(key):
        alloc.free(v[aligned:])
    return True


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_randomized_against_brute_force(page_size):
    rng = random.Random(42 + page_size)
    size = 256
    alloc, cache = make(size, page_size)
    ps = page_size
    model: dict[tuple, list[int]] = {}  # aligned prefix -> slots of its last page
    locks: list[tuple] = []  # (node, matched key) currently locked
    # keys are built from a few page patterns so that prefixes are shared often
    pages = [[rng.randint(0, 2) for _ in range(ps)] for _ in range(3)]

    def model_match(key):
        slots, k = [], ps
        while k <= len(key) and tuple(key[:k]) in model:
            slots += model[tuple(key[:k])]
            k += ps
        return slots

    def check():
        assert _tree_prefixes(cache) == model
        locked = {p for _, lk in locks for p in model if lk[: len(p)] == p}
        assert cache.protected_size() == ps * len(locked)
        assert cache.evictable_size() == ps * (len(model) - len(locked))
        assert cache.total_size() == cache.evictable_size() + cache.protected_size()
        assert alloc.available_size() == alloc.size - ps * len(model)

    for _ in range(400):
        op = rng.random()
        key = [t for _ in range(rng.randint(0, 4)) for t in rng.choice(pages)]
        if key and rng.random() < 0.3:  # mismatch inside a page
            key[rng.randrange(len(key))] = 3
        key += [rng.randint(0, 2) for _ in range(rng.randint(0, ps - 1))]  # unaligned tail
        if op < 0.4:
            need = len(key) - len(model_match(key))
            if alloc.available_size() < need + ps:
                cache.evict(need + ps)
                model = _tree_prefixes(cache)
                if alloc.available_size() < need + ps:
                    continue
            if rng.random() < 0.5:
                put(alloc, cache, key)
            elif not _insert_fresh(alloc, cache, key, len(model_match(key)), ps):
                continue
            n = len(key) // ps * ps
            for k in range(ps, n + 1, ps):
                model.setdefault(tuple(key[:k]), None)
            model = _fill(model, cache)
        elif op < 0.7:
            m = cache.match_prefix(key)
            assert m.indices.tolist() == model_match(key)
            assert m.indices.numel() % ps == 0
            if m.indices.numel() and rng.random() < 0.8:
                cache.inc_lock_ref(m.last_node)
                locks.append((m.last_node, tuple(key[: m.indices.numel()])))
        elif op < 0.85:
            if not locks:
                continue
            node, _ = locks.pop(rng.randrange(len(locks)))
            cache.dec_lock_ref(node)
        else:
            want = rng.randint(1, 12)
            ev_before, before = cache.evictable_size(), dict(model)
            freed = cache.evict(want)
            model = _tree_prefixes(cache)
            removed = set(before) - set(model)
            assert set(model) <= set(before)
            assert freed == ps * len(removed)
            assert freed >= min(want, ev_before) and (freed >= want or cache.evictable_size() == 0)
            locked = {p for _, lk in locks for p in before if lk[: len(p)] == p}
            assert not removed & locked
            for p in model:  # still prefix-closed
                assert len(p) == ps or p[:-ps] in model
        check()
    while locks:
        cache.dec_lock_ref(locks.pop()[0])
    cache.evict(size)
    assert cache.total_size() == 0 and alloc.available_size() == size


def _fill(model, cache):
    """New prefixes take the slots the tree chose; existing ones must keep their slots."""
    tree = _tree_prefixes(cache)
    for p, s in model.items():
        if s is not None:
            assert tree[p] == s, "cached slots of an existing prefix changed"
    assert set(tree) == set(model)
    return tree
