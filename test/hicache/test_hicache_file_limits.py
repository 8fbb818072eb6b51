"""The `file` backend's bounds (`--hicache-storage-backend-extra-config` `capacity_gb`,
`ttl_seconds`): the namespace folder stays within the capacity, least recently used pages going
first (a read refreshes a page; a restarted backend finds the folder's pages by their file times);
a page past its time-to-live is a miss and removed; a page another server removed is a plain miss
and the tree recomputes it; bad values are refused naming the key."""

from __future__ import annotations

import os
import time

import pytest
import torch
from test_hicache_tiers import PAGE, accounting_ok, make_tree, put, read

from sglang.srt.mem_cache.hicache.file_storage import FileLimits, FileStorage

PAYLOAD = 1000  # payload bytes of a page here (the file adds its 44-byte frame)


def folder_bytes(st: FileStorage) -> int:
    return sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(st.root) for f in fs if f.endswith(".kv")
    )


def names(st: FileStorage, n: int) -> list[str]:
    return st.page_hashes(list(range(1000, 1000 + 4 * n)), n)


def test_capacity_keeps_the_folder_bounded_least_recently_used_first(tmp_path):
    cap = 3 * (PAYLOAD + 44)  # three pages' files
    st = FileStorage(str(tmp_path), "ns", 4, FileLimits(capacity_bytes=cap))
    a, b, c, d, e = names(st, 5)
    for n in (a, b, c):
        assert st.put(n, bytes([1]) * PAYLOAD)
    assert st.get(a) is not None  # a is now the most recently used
    assert st.put(d, bytes([2]) * PAYLOAD)  # evicts b, the least recently used
    assert not st.exists(b) and all(st.exists(n) for n in (a, c, d))
    assert folder_bytes(st) <= cap and st.stats.pages_evicted == 1
    # a restarted backend over the same folder: the files' times order them, the bound holds
    time.sleep(0.01)
    os.utime(st._path(c), (time.time() - 100, time.time() - 100))  # c: used long ago
    again = FileStorage(str(tmp_path), "ns", 4, FileLimits(capacity_bytes=2 * (PAYLOAD + 44)))
    assert not again.exists(c) and again.exists(a) and again.exists(d)
    assert folder_bytes(again) <= 2 * (PAYLOAD + 44)
    assert again.put(e, bytes([3]) * PAYLOAD) and folder_bytes(again) <= 2 * (PAYLOAD + 44)
    assert again.stats.pages_evicted == 2
    unbounded = FileStorage(str(tmp_path), "ns2", 4)  # no capacity: nothing removed
    for n in (a, b, c, d, e):
        assert unbounded.put(n, bytes([4]) * PAYLOAD)
    assert all(unbounded.exists(n) for n in (a, b, c, d, e)) and unbounded.stats.pages_evicted == 0


def test_time_to_live_makes_old_pages_misses(tmp_path):
    st = FileStorage(str(tmp_path), "ttl", 4, FileLimits(ttl_s=60.0))
    old, fresh = names(st, 2)
    assert st.put(old, b"o" * PAYLOAD) and st.put(fresh, b"f" * PAYLOAD)
    past = time.time() - 120
    os.utime(st._path(old), (past, past))
    assert st.get(old) is None and not os.path.exists(st._path(old))
    assert st.get(fresh) == b"f" * PAYLOAD and st.exists(fresh)
    assert st.stats.pages_evicted == 1 and st.stats.read_failures == 0  # expiry is no failure


def test_a_page_another_server_evicted_is_recomputed(tmp_path):
    """Two backends share one folder (two servers of one model); the second's capacity removes a
    page the first's tree then wants: the first loads the pages before it and recomputes the
    rest, with the same KV as a tree that never had storage."""
    sp = 2 * PAGE
    writer = FileStorage(str(tmp_path), "ns", sp)
    tree, pool, alloc = make_tree(storage=writer)
    tokens = list(range(30, 46))  # four storage pages
    rows = put(tree, alloc, pool, tokens, 7)
    assert writer.stats.pages_written == 4
    pages = writer.page_hashes(tokens, 4)
    os.remove(writer._path(pages[2]))  # as the other server's eviction does
    fresh, pool2, alloc2 = make_tree(storage=FileStorage(str(tmp_path), "ns", sp))
    m = fresh.match_and_load(tokens)
    assert m.prefix_len == 8  # pages 0 and 1; page 2 missing: the rest is recomputed
    assert all(torch.equal(x, y[:8]) for x, y in zip(read(pool2, m.indices), rows))
    assert fresh.storage.stats.read_failures == 0 and accounting_ok(fresh, alloc2)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"capacity_gb": 0}, "capacity_gb must be a number > 0, got 0"),
        ({"capacity_gb": "1"}, "capacity_gb must be a number > 0, got '1'"),
        ({"ttl_seconds": -1}, "ttl_seconds must be a number >= 0, got -1"),
        ({"ttl_seconds": True}, "ttl_seconds must be a number >= 0, got True"),
    ],
)
def test_bad_values_refused_by_key(extra, message):
    import json

    from sglang.srt.server_args import ServerArgs

    with pytest.raises(ValueError, match=message):
        FileLimits.from_extra(extra)
    args = ServerArgs(
        model_path="m",
        load_format="dummy",
        enable_hierarchical_cache=True,
        hicache_storage_backend="file",
        hicache_storage_backend_extra_config=json.dumps(extra),
    )
    with pytest.raises(ValueError, match=message):
        args.validate()
    assert FileLimits.from_extra({"capacity_gb": 0.5, "ttl_seconds": 0}) == FileLimits(500_000_000, None)
