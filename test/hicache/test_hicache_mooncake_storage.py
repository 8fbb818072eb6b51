"""The HiCache `mooncake` storage backend against a real `mooncake_master` (one per module, on a
free port): pages round-trip between two clients of one store, a missing page is a plain miss,
a corrupted page is counted and overwritten, `clear` removes one namespace only; the config's
keys, environment fallbacks and the refusals (no master address, no mooncake); an unreachable or
killed master is a counted miss that costs no RPC timeout, and a master killed in the middle of
a tree's load leaves the pages read so far loaded and the rest recomputed."""

from __future__ import annotations

import sys
import time
from collections import Counter

import pytest
import torch

pytest.importorskip("mooncake.store")  # the `pd` extra

from mooncake_helpers import LEASE_MS, MooncakeMaster  # noqa: E402
from test_hicache_tiers import accounting_ok, make_tree, put, read  # noqa: E402

from sglang.srt.disaggregation.mooncake.data_plane import PACKAGES_FIX  # noqa: E402
from sglang.srt.mem_cache.hicache.mooncake_config import (  # noqa: E402
    MooncakeConfig,
    mooncake_config,
    parse_size,
)
from sglang.srt.mem_cache.hicache.mooncake_storage import MooncakeStorage, connect_store  # noqa: E402
from sglang.srt.mem_cache.hicache.page_store import frame  # noqa: E402

PAGE = 8
TOKENS = list(range(100, 132))  # four storage pages


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    m = MooncakeMaster(tmp_path_factory.mktemp("mooncake"))
    service = m.store_service()
    yield m, service
    service.close()
    m.kill()


def storage(m: MooncakeMaster, namespace: str = "ns", **kw) -> MooncakeStorage:
    return MooncakeStorage(m.config(**kw), namespace, PAGE, page_bytes=1024)


def test_pages_round_trip_between_clients_of_one_store(master):
    m, _ = master
    a, b, other = storage(m, "rt"), storage(m, "rt"), storage(m, "rt-other-model")
    names = a.page_hashes(TOKENS, 4)
    assert names == b.page_hashes(TOKENS, 4) and names != other.page_hashes(TOKENS, 4)
    assert not a.exists(names[0]) and a.get(names[0]) is None
    assert a.stats.read_failures == 0  # a plain miss is no failure
    payloads = [bytes([i]) * 1000 for i in range(4)]
    for n, p in zip(names, payloads):
        assert a.put(n, p)
    assert a.put(names[0], payloads[0])  # a page already there: left as is, no failure
    assert a.stats.pages_written == 5 and a.stats.write_failures == 0
    assert [b.get(n) for n in names] == payloads and b.stats.pages_read == 4  # another server reads them
    assert all(b.exists(n) for n in names)
    assert not other.exists(names[0]) and other.get(other.page_hashes(TOKENS, 1)[0]) is None
    assert a.stats.unreachable == b.stats.unreachable == 0


def test_a_corrupted_page_is_counted_and_overwritten(master):
    m, service = master
    st = storage(m, "corrupt")
    names = st.page_hashes(TOKENS, 2)
    good = b"kv" * 300
    assert service.put(st.key(names[0]), b"not a page") == 0
    bad = bytearray(frame(good))
    bad[-1] ^= 1  # one payload bit flipped
    assert service.put(st.key(names[1]), bytes(bad)) == 0
    assert st.get(names[0]) is None and st.get(names[1]) is None
    assert st.stats.read_failures == 2 and st.stats.pages_read == 0
    assert not st.exists(names[1])  # so the recomputed page is written again ...
    assert st.put(names[1], good) and st.get(names[1]) == good  # ... over the bad one
    assert st.stats.read_failures == 2


def test_clear_removes_one_namespace(master):
    m, _ = master
    st, other = storage(m, "clear"), storage(m, "clear-other")
    for n in st.page_hashes(TOKENS, 3):
        assert st.put(n, b"x" * 100)
    keep = other.page_hashes(TOKENS, 1)[0]
    assert other.put(keep, b"keep")
    time.sleep(2 * LEASE_MS / 1000)  # the master keeps a page while its lease runs
    assert st.clear() == 3
    assert not any(st.exists(n) for n in st.page_hashes(TOKENS, 3))
    assert other.get(keep) == b"keep"


def test_config_keys_environment_and_refusal():
    with pytest.raises(ValueError, match="master_server_address"):
        mooncake_config({}, environ={})
    with pytest.raises(ValueError, match="host:port"):
        mooncake_config({"master_server_address": "nohost"}, environ={})
    env = {
        "MOONCAKE_MASTER": "10.0.0.1:50051",
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": "1gb",
        "MOONCAKE_PROTOCOL": "rdma",
        "MOONCAKE_TE_META_DATA_SERVER": "http://10.0.0.1:8080/metadata",
    }
    c = mooncake_config({"global_segment_size": 0, "local_buffer_size": "32 MiB"}, environ=env)
    assert c == MooncakeConfig(
        "10.0.0.1:50051",
        metadata_server="http://10.0.0.1:8080/metadata",
        protocol="rdma",
        global_segment_size=0,  # the extra config wins over the environment
        local_buffer_size=32 << 20,
    )
    assert c.master_host_port() == ("10.0.0.1", 50051)
    d = mooncake_config({"master_server_address": "h:1"}, environ={})
    assert (d.metadata_server, d.protocol, d.global_segment_size) == ("P2PHANDSHAKE", "tcp", 4 << 30)
    assert parse_size(4096, "k") == 4096 and parse_size("1.5kb", "k") == 1536
    with pytest.raises(ValueError, match="global_segment_size"):
        mooncake_config({"master_server_address": "h:1", "global_segment_size": "lots"}, environ={})


def test_refused_without_mooncake(monkeypatch):
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path="m",
        load_format="dummy",
        enable_hierarchical_cache=True,
        hicache_storage_backend="mooncake",
        hicache_storage_backend_extra_config='{"master_server_address": "127.0.0.1:1"}',
    )
    args.validate()
    monkeypatch.setitem(sys.modules, "mooncake.store", None)  # `import mooncake.store` fails
    with pytest.raises(RuntimeError, match="store client cannot be loaded") as err:
        args.validate()
    assert PACKAGES_FIX in str(err.value)


class KillsMasterAfterOneRead(MooncakeStorage):
    """A master that dies while a tree loads: after the first page read (one page per batch)."""

    def __init__(self, master: MooncakeMaster, *args, **kw):
        super().__init__(*args, **kw)
        self.master = master
        self.batch_pages = 1

    def _checked(self, *args):
        out = super()._checked(*args)
        if self.stats.pages_read == 1:
            self.master.kill()
        return out


class CountingClient:
    """A real store client that counts the calls made to it."""

    def __init__(self, store):
        self.store, self.calls = store, Counter()

    def __getattr__(self, name):
        self.calls[name] += 1
        return getattr(self.store, name)


def counting(m: MooncakeMaster, namespace: str) -> tuple[MooncakeStorage, CountingClient]:
    made = []

    def connect(config, size):
        made.append(CountingClient(connect_store(config, size)))
        return made[0]

    st = MooncakeStorage(m.config(), namespace, PAGE, page_bytes=1024, connect=connect)
    return st, made[0]


class _SecondEmpty:
    """A store client whose `get_batch` answers its second page with no bytes."""

    def __init__(self, store):
        self.store = store

    def __getattr__(self, name):
        return getattr(self.store, name)

    def get_batch(self, keys):
        out = list(self.store.get_batch(keys))
        out[1] = b""
        return out


def test_a_page_the_batch_answers_empty_is_read_alone(master):
    """A stored page that `get_batch` answers with no bytes (seen once in a full suite run) is read
    again by `get` before it counts as unreadable: the run goes on, no failure counted."""
    m, _ = master
    writer = storage(m, "batch-retry")
    names = writer.page_hashes(list(range(300, 324)), 3)
    payloads = [bytes([7 + i]) * 700 for i in range(3)]
    for name, payload in zip(names, payloads):
        assert writer.put(name, payload)
    st, client = counting(m, "batch-retry")
    client.store = _SecondEmpty(client.store)
    assert st.get_run(names) == payloads and st.stats.read_failures == 0
    assert client.calls["get"] == 1


def test_existence_checks_and_reads_are_batched(master):
    """One `batch_is_exist` RPC for a path's pages, `get_batch` reads up to the first miss (in
    batches of `batch_pages`), a corrupted page in a batch ends the run, counted; through a tree's
    load too: one RPC for three pages."""
    m, service = master
    writer = storage(m, "batch")
    tokens = list(range(200, 248))  # six storage pages
    names = writer.page_hashes(tokens, 6)
    payloads = [bytes([i]) * 900 for i in range(6)]
    for i in (0, 1, 2, 4):
        assert writer.put(names[i], payloads[i])
    st, client = counting(m, "batch")
    assert st.exists_many(names) == [True, True, True, False, True, False]
    assert st.get_run(names) == payloads[:3] and st.stats.pages_read == 3
    assert st.get_run(names[3:]) == [] and st.stats.read_failures == 0  # a plain miss
    assert client.calls["batch_is_exist"] == 1 and client.calls["get_batch"] == 2
    assert (
        client.calls["get"] == 2 and client.calls["is_exist"] == 2
    )  # each run-ending miss asked alone once, then told from a failure
    st.batch_pages = 2
    assert st.get_run(names[:3]) == payloads[:3] and client.calls["get_batch"] == 4

    assert service.put(st.key(names[5]), b"junk") == 0
    assert writer.put(names[3], payloads[3])
    assert st.get_run(names) == payloads[:5] and st.stats.read_failures == 1
    assert st.exists_many(names[4:]) == [True, False]  # the bad page is rewritten by the next put

    first, pool, alloc = make_tree(l1=64, storage=storage(m, "batch-tree"))
    rows = put(first, alloc, pool, tokens[: 3 * PAGE + 1], 3)
    tree_st, tree_client = counting(m, "batch-tree")
    tree, pool2, alloc2 = make_tree(l1=64, storage=tree_st)
    match = tree.match_and_load(tokens[: 3 * PAGE + 1])
    assert match.prefix_len == 3 * PAGE and tree.hstats.l3_hit_tokens == 3 * PAGE
    assert all(torch.equal(x, y[: 3 * PAGE]) for x, y in zip(read(pool2, match.indices), rows))
    assert tree_client.calls["get_batch"] == 1 and tree_client.calls["get"] == 0
    assert accounting_ok(tree, alloc2)


@pytest.mark.slow  # the client's RPC timeout (~4 s) on the read the master dies under
def test_master_killed_mid_load_keeps_what_was_read(tmp_path):
    m = MooncakeMaster(tmp_path)
    service = m.store_service()
    sp = 4  # a storage page of two KV pages
    a = list(range(50, 63))  # three whole storage pages
    try:
        writer = MooncakeStorage(m.config(), "mid", sp)
        tree, pool, alloc = make_tree(storage=writer)
        rows = put(tree, alloc, pool, a, 3)
        assert writer.stats.pages_written == 3
        st = KillsMasterAfterOneRead(m, m.config(retry_interval_s=60.0), "mid", sp)
        fresh, pool2, alloc2 = make_tree(storage=st)
        t0 = time.monotonic()
        match = fresh.match_and_load(a)
        assert time.monotonic() - t0 < 15
    finally:
        m.kill()
        service.close()
    assert match.prefix_len == 4 and fresh.hstats.l3_hit_tokens == 4  # page 0 only: the rest recomputed
    assert all(torch.equal(x, y[:4]) for x, y in zip(read(pool2, match.indices), rows))
    assert st.stats.read_failures == 1 and st.stats.unreachable == 1
    assert accounting_ok(fresh, alloc2)


def test_unreachable_master_is_a_counted_miss(tmp_path):
    from mooncake_helpers import free_port

    nobody = MooncakeConfig(f"127.0.0.1:{free_port()}", retry_interval_s=0.0)
    t0 = time.monotonic()
    st = MooncakeStorage(nobody, "down", PAGE)  # the store is never set up against a dead master
    name = st.page_hashes(TOKENS, 1)[0]
    assert st.get(name) is None and not st.put(name, b"x") and not st.exists(name) and st.clear() == 0
    assert st.stats.read_failures == 1 and st.stats.write_failures == 1 and st.stats.unreachable >= 2
    assert time.monotonic() - t0 < 5


@pytest.mark.slow  # a client of a dead master takes seconds to go away
def test_killed_master_is_skipped_without_rpc_timeouts(tmp_path):
    name = "ab" * 32
    m = MooncakeMaster(tmp_path)  # a master that dies while a client is connected
    try:
        st = storage(m, "killed", segment=16 << 20, retry_interval_s=60.0)
        assert st.put(name, b"y" * 100) and st.get(name) == b"y" * 100
    finally:
        m.kill()
    time.sleep(1.1)  # the next call probes the master
    t0 = time.monotonic()
    assert st.get(name) is None and not st.put(name, b"y") and not st.exists(name)
    assert time.monotonic() - t0 < 3  # no RPC timeout per page: the client is closed, skipped
    assert st.stats.unreachable == 1 and st.stats.read_failures == 1 and st.stats.write_failures == 1


def test_decode_offload_checks_a_path_in_one_rpc(master):
    """A PD decode server's offload (decode_offload.py): one `batch_is_exist` per finished
    request, whatever its length; only the missing pages are written."""
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.hicache.decode_offload import OffloadingRadixCache

    m, _ = master
    st, client = counting(m, "offload")
    alloc = TokenToKVPoolAllocator(128, 2)
    tree = OffloadingRadixCache(alloc, 2, st, lambda slots: bytes([len(slots)]) * 100)
    tokens = list(range(500, 534))  # four whole storage pages and a tail
    tree.insert(tokens, alloc.alloc(len(tokens)))
    assert tree.ostats.pages_written == 4 and client.calls["batch_is_exist"] == 1
    assert client.calls["is_exist"] == 0 and client.calls["put_batch"] == 1 and client.calls["put"] == 0
    tree.offload(tokens + [1, 2, 3, 4, 5, 6], alloc.alloc(40))  # the next turn's path: one page more
    assert client.calls["batch_is_exist"] == 2 and client.calls["put_batch"] == 2
    assert tree.ostats.pages_present == 4 and tree.ostats.pages_written == 5
    names = st.page_hashes(tokens + [1, 2, 3, 4, 5, 6], 5)
    assert [len(p) for p in st.get_run(names)] == [100] * 5 and st.stats.pages_written == 5


def test_batched_writes(master):
    """`put_many`: one `put_batch` per `batch_pages` pages (a page already stored is left as is,
    no failure); a page that failed its check is replaced by `upsert_batch`."""
    m, service = master
    st, client = counting(m, "putmany")
    names = st.page_hashes(list(range(600, 640)), 5)
    payloads = [bytes([i + 1]) * 700 for i in range(5)]
    assert st.put_many(names[:2], payloads[:2]) == 2 and client.calls["put_batch"] == 1
    assert st.put_many(names[1:4], payloads[1:4]) == 3  # names[1] is there already
    assert client.calls["put_batch"] == 2 and client.calls["put"] == 0
    assert st.get_run(names) == payloads[:4] and st.stats.write_failures == 0
    assert service.put(st.key(names[4]), b"junk") == 0
    assert st.get_run(names[4:]) == [] and st.stats.read_failures == 1  # now marked bad
    st.batch_pages = 1
    assert st.put_many(names[4:], payloads[4:]) == 1 and client.calls["upsert_batch"] == 1
    assert st.get_run(names) == payloads and st.stats.pages_written == 6


def test_a_refused_batch_is_written_page_by_page(master):
    """Which pages of a refused `put_batch` landed is not known: the batch is written page by page
    (the store's refusal is simulated; every page goes through the real store)."""
    m, _ = master
    st, client = counting(m, "refused")
    client.store = RefusesBatches(client.store)
    names = st.page_hashes(list(range(700, 724)), 3)
    payloads = [bytes([i + 7]) * 300 for i in range(3)]
    assert st.put_many(names, payloads) == 3 and client.calls["put"] == 3
    assert st.get_run(names) == payloads and st.stats.write_failures == 0


class RefusesBatches:
    def __init__(self, store):
        self.store = store

    def put_batch(self, keys, values):
        return -700  # a segment full, say: nothing written

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_batches_fit_the_clients_local_buffer(master):
    """Pages of SmolLM2's size (64 tokens, bfloat16: 1.47 MB) against a 16 MiB local buffer: the
    batches the backend makes fit it (its allocator rounds each page up), so a 20-page prefix is
    written and read back whole, without failures."""
    m, _ = master
    page_bytes = 64 * 30 * 2 * 3 * 64 * 2
    st = MooncakeStorage(m.config(local_buffer_size=16 << 20), "big", PAGE, page_bytes=page_bytes)
    assert 1 < st.batch_pages < 20
    names = st.page_hashes(list(range(160)), 20)
    payloads = [bytes([i]) * page_bytes for i in range(20)]
    assert st.put_many(names, payloads) == 20
    got = st.get_run(names)
    assert len(got) == 20 and got == payloads
    assert st.stats.read_failures == st.stats.write_failures == 0
