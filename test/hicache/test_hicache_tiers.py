"""HiCache's pieces on their own (no model): the host pool's copies, the tree's record of where
each node's KV lives (L1 / L2 / L3) under each write policy, and the file backend's checks."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.hicache.file_storage import FileStorage
from sglang.srt.mem_cache.hicache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.hicache.host_pool import HostKVPool, TokenLayout, kv_token_buffers
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.mla_kv_pool import MLATokenToKVPool

PAGE = 2


def make_tree(l1=16, l2=32, policy="write_through", storage=None, page=PAGE):
    pool = MHATokenToKVPool(l1, page, torch.float32, head_num=2, head_dim=4, layer_num=2)
    alloc = TokenToKVPoolAllocator(l1, page)
    host = HostKVPool(kv_token_buffers(pool), l2, page)
    return HiRadixCache(alloc, page, host, policy, storage), pool, alloc


def fill(pool, slots, seed):
    """Write recognisable K/V for `slots` into every layer; returns what was written."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for buf in kv_token_buffers(pool):
        r = torch.randn((len(slots), *buf.shape[1:]), generator=g)
        buf[slots] = r
        rows.append(r)
    return rows


def read(pool, slots):
    return [buf[slots].clone() for buf in kv_token_buffers(pool)]


def put(tree, alloc, pool, tokens, seed):
    slots = alloc.alloc(len(tokens))
    rows = fill(pool, slots, seed)
    assert tree.insert(tokens, slots) == 0
    return rows


def accounting_ok(tree, alloc):
    return alloc.available_size() + tree.evictable_size() + tree.protected_size() == alloc.size


def test_host_pool_round_trip_and_layout_bytes():
    pool = MLATokenToKVPool(8, 1, torch.float32, kv_lora_rank=6, qk_rope_head_dim=2, layer_num=3)
    bufs = kv_token_buffers(pool)
    assert len(bufs) == 3
    host = HostKVPool(bufs, 16, 1)
    dev = torch.tensor([1, 2, 3])
    rows = fill(pool, dev, 0)
    hs = host.alloc(3)
    host.backup(dev, hs)
    for b in bufs:
        b.zero_()
    back = torch.tensor([5, 6, 7])
    host.restore(hs, back)
    assert all(torch.equal(a, b) for a, b in zip(read(pool, back), rows))
    layout = TokenLayout(bufs)
    assert layout.token_bytes() == 3 * 8 * 4
    data = layout.pack(bufs, back)
    layout.unpack_into(bufs, torch.tensor([1, 2, 4]), data)
    assert all(torch.equal(a, b) for a, b in zip(read(pool, torch.tensor([1, 2, 4])), rows))
    with pytest.raises(ValueError):
        layout.unpack_into(bufs, torch.tensor([1]), data)
    assert host.available_size() == 13
    host.free(hs)
    assert host.available_size() == 16


def test_eviction_demotes_to_host_and_load_restores_kv():
    tree, pool, alloc = make_tree()
    a = list(range(10, 20))  # 10 tokens = 5 pages
    rows = put(tree, alloc, pool, a, 1)
    assert tree.host_size() == 10  # write_through: copied on insert
    assert tree.evict(100) == 10 and alloc.available_size() == 16
    assert tree.match_prefix(a).prefix_len == 0  # estimates see L1 only
    node = tree.root_node.children[tuple(a[:PAGE])]
    assert node.value is None and node.host_value is not None
    fill(pool, torch.arange(1, 17), 99)  # the freed slots get overwritten
    m = tree.match_and_load(a + [7])
    assert m.prefix_len == 10 and tree.hstats.l2_hit_tokens == 10
    stats = tree.stats()
    assert (
        stats["hicache_loaded_bytes"] == 10 * 2 * 2 * 2 * 4 * 4
    )  # tokens x (K, V) x layers x heads x dim x 4 B
    assert stats["hicache_load_seconds"] > 0 and stats["hicache_host_tokens"] == 10
    assert stats["hicache_backup_seconds"] > 0 and stats["hicache_storage_write_seconds"] == 0  # no L3
    assert all(torch.equal(x, y) for x, y in zip(read(pool, m.indices), rows))
    assert accounting_ok(tree, alloc)


def test_split_keeps_both_tiers_and_insert_adopts_host_only_nodes():
    tree, pool, alloc = make_tree()
    a = list(range(12))
    put(tree, alloc, pool, a, 2)
    tree.evict(100)
    m = tree.match_prefix(a[:4] + [99, 98])  # walks and splits inside the L2-only node
    assert m.prefix_len == 0
    head = tree.root_node.children[(0, 1)]
    assert len(head.key) == 4 and head.host_value.numel() == 4 and head.value is None
    # a request that recomputed a[:8] hands its slots to the L2-only nodes: all of it back in L1
    slots = alloc.alloc(8)
    assert tree.insert(a[:8], slots) == 0
    assert tree.match_prefix(a).prefix_len == 8 and accounting_ok(tree, alloc)


def test_l1_stays_prefix_closed_and_locked_paths_survive():
    tree, pool, alloc = make_tree(l1=16, l2=32)
    a, b = list(range(8)), list(range(8)) + list(range(100, 106))
    put(tree, alloc, pool, a, 3)
    slots = torch.cat([tree.match_prefix(a).indices, alloc.alloc(6)])
    tree.insert(b, slots)
    m = tree.match_prefix(b)
    tree.inc_lock_ref(m.last_node)
    assert tree.evict(100) == 0  # everything locked
    tree.dec_lock_ref(m.last_node)
    assert tree.evict(6) == 6  # the leaf goes first; its parent stays in L1
    assert tree.match_prefix(b).prefix_len == 8
    tree.evict(100)
    assert tree.evictable_size() == 0 and alloc.available_size() == 16 and tree.host_size() == 14


def test_host_tier_full_drops_oldest_and_counts():
    tree, pool, alloc = make_tree(l1=16, l2=8)
    seqs = [[i * 100 + j for j in range(8)] for i in range(3)]
    for i, s in enumerate(seqs):
        put(tree, alloc, pool, s, i)
        tree.evict(100)
    assert tree.host_size() <= 8 and tree.hstats.l2_evicted_tokens >= 16
    assert tree.match_and_load(seqs[0]).prefix_len == 0  # forgotten
    assert tree.match_and_load(seqs[2]).prefix_len == 8  # the newest survived
    assert accounting_ok(tree, alloc)


@pytest.mark.parametrize("policy", ["write_back", "write_through_selective"])
def test_write_policies(policy):
    tree, pool, alloc = make_tree(policy=policy)
    a = list(range(8))
    put(tree, alloc, pool, a, 5)
    assert tree.host_size() == 0  # neither copies on insert
    if policy == "write_through_selective":
        tree.match_and_load(a)
        tree.match_and_load(a)  # second hit: copied
        assert tree.host_size() == 8
        b = list(range(50, 58))
        put(tree, alloc, pool, b, 6)
        tree.evict(100)
        assert tree.hstats.l1_dropped_tokens == 8  # b was never hit: forgotten
        assert tree.match_and_load(a).prefix_len == 8
    else:
        tree.evict(100)
        assert tree.host_size() == 8 and tree.match_and_load(a).prefix_len == 8
    assert accounting_ok(tree, alloc)


def test_file_storage_checksum_missing_dir_and_namespace(tmp_path):
    d = str(tmp_path / "store")
    st = FileStorage(d, "model-a|tp0/1", 2)
    names = st.page_hashes([1, 2, 3, 4, 5], 2)
    assert len(names) == 2 and names[0] != names[1]
    assert names[0] == st.page_hashes([1, 2, 9, 9], 1)[0]  # chained: a page depends on its prefix only
    assert st.page_hashes([9, 9, 3, 4], 2)[1] != names[1]
    assert FileStorage(d, "model-a|tp1/2", 2).page_hashes([1, 2], 1)[0] != names[0]
    assert st.put(names[0], b"abc") and st.get(names[0]) == b"abc"
    assert st.get(names[1]) is None and st.stats.read_failures == 0  # a miss is not a failure
    path = st._path(names[0])
    raw = bytearray(open(path, "rb").read())
    raw[-1] ^= 1
    open(path, "wb").write(bytes(raw))
    assert st.get(names[0]) is None and st.stats.read_failures == 1
    open(path, "wb").write(b"xx")
    assert st.get(names[0]) is None and st.stats.read_failures == 2
    assert not os.path.exists(path)  # a bad page is removed, so the recomputed one is written again
    other = FileStorage(d, "model-b|tp0/1", 2)
    assert other.put(names[0], b"keep") and st.put(names[0], b"abc") and st.clear() == 1
    assert not os.path.exists(os.path.dirname(path)) and other.get(names[0]) == b"keep"
    assert other.clear() == 1
    shutil.rmtree(d)  # the whole directory gone (a namespace made by the tp1 storage above too)
    assert st.get(names[0]) is None  # the directory is gone: a miss
    assert st.put(names[1], b"z") and st.get(names[1]) == b"z"  # recreated on write


def test_storage_tier_serves_a_new_tree_and_skips_bad_pages(tmp_path):
    sp = 2 * PAGE  # a storage page spans two KV pages
    st = FileStorage(str(tmp_path), "ns", sp)
    tree, pool, alloc = make_tree(storage=st)
    a = list(range(30, 40))
    rows = put(tree, alloc, pool, a, 7)
    assert st.stats.pages_written == 2  # 10 tokens: two whole storage pages; the tail waits
    st2 = FileStorage(str(tmp_path), "ns", sp)
    fresh, pool2, alloc2 = make_tree(storage=st2)  # a restarted server: empty L1 and L2
    m = fresh.match_and_load(a + [1])
    assert m.prefix_len == 8 and fresh.hstats.l3_hit_tokens == 8
    assert all(torch.equal(x, y[:8]) for x, y in zip(read(pool2, m.indices), rows))
    assert accounting_ok(fresh, alloc2)
    # a prefix already in L1 ending inside a storage page: only the rest of that page is loaded
    part, pool3, alloc3 = make_tree(storage=FileStorage(str(tmp_path), "ns", sp))
    put(part, alloc3, pool3, a[:2], 8)
    m = part.match_and_load(a)
    assert m.prefix_len == 8 and part.hstats.l3_hit_tokens == 6
    assert all(torch.equal(x[2:], y[2:8]) for x, y in zip(read(pool3, m.indices), rows))
    assert accounting_ok(part, alloc3)
    # page 1 corrupted: a new tree loads page 0 only and counts the failure
    bad = st.page_hashes(a, 2)[1]
    with open(st._path(bad), "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)[0]
        f.seek(-1, 2)
        f.write(bytes([last ^ 0x5A]))
    st4 = FileStorage(str(tmp_path), "ns", sp)
    third, _, alloc4 = make_tree(storage=st4)
    assert third.match_and_load(a).prefix_len == 4 and st4.stats.read_failures == 1
    assert accounting_ok(third, alloc4)
    other = make_tree(storage=FileStorage(str(tmp_path), "other-model", sp))[0]
    assert other.match_and_load(a).prefix_len == 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (dict(hicache_storage_backend="mooncake"), "mooncake needs the master's address"),
        (dict(pp_size=2, hicache_size=1.0), "with --pp-size > 1 and --hicache-size"),
        (dict(disaggregation_mode="decode"), "refused with --disaggregation-mode decode"),
        (dict(disable_radix_cache=True), "with --disable-radix-cache is not supported yet"),
        (dict(hicache_ratio=0.5), "--hicache-ratio must be > 1"),
        (dict(hicache_storage_backend_extra_config="[1]"), "must be a JSON object"),
        (dict(hicache_storage_backend_extra_config='{"page_tokens": 0}'), "page_tokens must be an int >= 1"),
        (dict(hicache_write_policy="write_around"), "--hicache-write-policy must be one of"),
        (
            dict(hicache_io_backend="kernel_ascend"),
            "--hicache-io-backend kernel_ascend is not supported: Ascend",
        ),
        (dict(hicache_io_backend="dma"), "--hicache-io-backend must be one of"),
        (dict(hicache_mem_layout="page_first"), "--hicache-mem-layout page_first is not supported: the host"),
        (dict(hicache_mem_layout="page_head"), "--hicache-mem-layout page_head is not supported: the host"),
        (
            dict(hicache_mem_layout="page_first_direct"),
            "--hicache-mem-layout page_first_direct is not supported",
        ),
    ],
)
def test_unsupported_flag_combinations_refused_by_name(extra, message):
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path="m", load_format="dummy", enable_hierarchical_cache=True, **extra)
    with pytest.raises(ValueError, match=message):
        args.validate()
    with pytest.raises(ValueError, match="needs --enable-hierarchical-cache"):
        ServerArgs(model_path="m", load_format="dummy", hicache_storage_backend="file").validate()


def test_storage_namespace_names_the_checkpoint():
    from types import SimpleNamespace

    from sglang.srt.mem_cache.hicache.factory import model_identity

    base = dict(model_path="m", revision=None, load_format="dummy", quantization=None, random_seed=1)
    assert model_identity(SimpleNamespace(**base)) != model_identity(
        SimpleNamespace(**{**base, "random_seed": 2})
    )
    real = {**base, "load_format": "auto"}
    assert model_identity(SimpleNamespace(**real)) == model_identity(
        SimpleNamespace(**{**real, "random_seed": 2})
    )
    assert model_identity(SimpleNamespace(**real)) != model_identity(
        SimpleNamespace(**{**real, "revision": "v2"})
    )


def test_upstream_launch_line_parses():
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(
        [
            *("--model-path", "m", "--load-format", "dummy", "--enable-hierarchical-cache"),
            *("--hicache-ratio", "3", "--hicache-write-policy", "write_back"),
            *("--hicache-storage-backend", "file", "--hicache-storage-prefetch-policy", "wait_complete"),
            *("--hicache-storage-backend-extra-config", '{"file_path": "/tmp/x", "page_tokens": 16}'),
            *("--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first"),
        ]
    )
    args.validate()
    assert args.hicache_io_backend == "direct" and args.hicache_mem_layout == "layer_first"
    assert args.enable_hierarchical_cache and args.hicache_ratio == 3.0
    assert args.hicache_write_policy == "write_back" and args.hicache_storage_backend == "file"
    from sglang.srt.mem_cache.hicache.factory import storage_dir, storage_page_tokens

    assert storage_dir(args) == "/tmp/x" and storage_page_tokens(args, 5) == 20


def test_file_directory_from_upstream_env_var(monkeypatch):
    from types import SimpleNamespace

    from sglang.srt.mem_cache.hicache.factory import DEFAULT_FILE_DIR, storage_dir

    args = SimpleNamespace(hicache_storage_backend_extra_config="")
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", raising=False)
    assert storage_dir(args) == DEFAULT_FILE_DIR
    monkeypatch.setenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", "/data/kv")
    assert storage_dir(args) == "/data/kv"
    args.hicache_storage_backend_extra_config = '{"file_path": "/other"}'
    assert storage_dir(args) == "/other"  # the extra config wins
