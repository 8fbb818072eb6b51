"""A PD decode server's L3 writes (--disaggregation-decode-enable-offload-kvcache) without a model:
the pages its cache writes are the pages a prefill server's HiCache of the same model and layout
reads (both built by the factory from their server args); failed writes and corrupted pages are
counted and recomputed; the flag combinations refused by name."""

from __future__ import annotations

import json
import os

import pytest
import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.hicache.decode_offload import OffloadingRadixCache
from sglang.srt.mem_cache.hicache.factory import RankPlace, create_prefix_cache
from sglang.srt.mem_cache.hicache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.hicache.host_pool import kv_token_buffers
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool

PAGE = 2
STORAGE_PAGE = 4
PLACE = RankPlace(PAGE, "tp0/1|pp0|cp0|torch.float32|layers0-2")


def server_args(tmp_path, **kw):
    from sglang.srt.server_args import ServerArgs

    extra = json.dumps({"file_path": str(tmp_path), "page_tokens": STORAGE_PAGE})
    args = ServerArgs(
        model_path="m",
        load_format="dummy",
        hicache_storage_backend="file",
        hicache_storage_backend_extra_config=extra,
        **kw,
    )
    args.validate()
    return args


def decode_args(tmp_path):
    return server_args(
        tmp_path, disaggregation_mode="decode", disaggregation_decode_enable_offload_kvcache=True
    )


def prefill_args(tmp_path):
    return server_args(tmp_path, disaggregation_mode="prefill", enable_hierarchical_cache=True)


def side(args, tokens=32):
    pool = MHATokenToKVPool(tokens, PAGE, torch.float32, head_num=2, head_dim=4, layer_num=2)
    alloc = TokenToKVPoolAllocator(tokens, PAGE)
    return create_prefix_cache(args, alloc, pool, PLACE), pool, alloc


def fill(pool, slots, seed):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for buf in kv_token_buffers(pool):
        r = torch.randn((len(slots), *buf.shape[1:]), generator=g)
        buf[slots] = r
        rows.append(r)
    return rows


def finish_on_decode(tree, pool, alloc, tokens, seed=0):
    """What the scheduler's release does with a finished request's KV: insert it, then free it."""
    slots = alloc.alloc(len(tokens))
    rows = fill(pool, slots, seed)
    already = tree.insert(tokens, slots)
    if already:
        alloc.free(slots[:already])  # duplicates of what the tree holds
    return rows


def accounting_ok(tree, alloc):
    return alloc.available_size() + tree.evictable_size() + tree.protected_size() == alloc.size


def test_prefill_loads_the_pages_the_decode_side_wrote(tmp_path):
    decode, dpool, dalloc = side(decode_args(tmp_path))
    assert isinstance(decode, OffloadingRadixCache)
    history = list(range(100, 114))  # prompt + output of turn 1: 14 tokens, 3 whole storage pages
    rows = finish_on_decode(decode, dpool, dalloc, history)
    assert decode.ostats.pages_written == 3 and decode.stats()["hicache_storage_pages_written"] == 3
    assert accounting_ok(decode, dalloc)

    prefill, ppool, palloc = side(prefill_args(tmp_path))
    assert isinstance(prefill, HiRadixCache)
    turn2 = history + [7, 8, 9]
    match = prefill.match_and_load(turn2[:-1])
    assert match.prefix_len == 12 and prefill.hstats.l3_hit_tokens == 12
    got = [buf[match.indices] for buf in kv_token_buffers(ppool)]
    assert all(torch.equal(g, r[:12]) for g, r in zip(got, rows))
    assert accounting_ok(prefill, palloc)

    # the same history again (a retried turn): nothing new to write
    finish_on_decode(decode, dpool, dalloc, history, seed=1)
    assert decode.ostats.pages_written == 3 and decode.ostats.pages_present == 3


def test_a_failed_write_is_counted_and_the_prefill_recomputes(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # the storage directory cannot be created under a file
    decode, dpool, dalloc = side(decode_args(blocker))
    history = list(range(200, 212))
    finish_on_decode(decode, dpool, dalloc, history)
    assert decode.ostats.pages_written == 0 and decode.ostats.write_failures == 1
    assert decode.match_prefix(history).prefix_len == 12 and accounting_ok(decode, dalloc)  # tree intact

    prefill, _, palloc = side(prefill_args(tmp_path))
    assert prefill.match_and_load(history + [1]).prefix_len == 0
    assert accounting_ok(prefill, palloc)


def test_a_corrupted_page_is_a_counted_miss(tmp_path):
    decode, dpool, dalloc = side(decode_args(tmp_path))
    history = list(range(300, 312))
    finish_on_decode(decode, dpool, dalloc, history)
    names = decode.storage.page_hashes(history, 3)
    path = decode.storage._path(names[1])
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0x5A
    with open(path, "wb") as f:
        f.write(bytes(data))
    prefill, _, palloc = side(prefill_args(tmp_path))
    match = prefill.match_and_load(history + [1])
    assert match.prefix_len == STORAGE_PAGE  # the page before the bad one
    assert prefill.storage.stats.read_failures == 1 and not os.path.exists(path)
    assert accounting_ok(prefill, palloc)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(disaggregation_decode_enable_offload_kvcache=True), "needs --disaggregation-mode decode"),
        (
            dict(disaggregation_mode="decode", disaggregation_decode_enable_offload_kvcache=True),
            "needs --hicache-storage-backend",
        ),
        (
            dict(
                disaggregation_mode="decode",
                disaggregation_decode_enable_offload_kvcache=True,
                hicache_storage_backend="file",
                disable_radix_cache=True,
            ),
            "offload-kvcache with --disable-radix-cache",
        ),
        (
            dict(disaggregation_mode="decode", enable_hierarchical_cache=True),
            "refused with --disaggregation-mode decode",
        ),
    ],
)
def test_flag_combinations_refused_by_name(kw, message):
    from sglang.srt.server_args import ServerArgs

    with pytest.raises(ValueError, match=message):
        ServerArgs(model_path="m", load_format="dummy", **kw).validate()


def test_upstream_flag_is_taken():
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    assert "--disaggregation-decode-enable-offload-kvcache" not in ServerArgs.UPSTREAM_FLAGS
    args = prepare_server_args(
        [
            *("--model-path", "m", "--load-format", "dummy", "--disaggregation-mode", "decode"),
            *("--disaggregation-decode-enable-offload-kvcache", "--hicache-storage-backend", "file"),
        ]
    )
    assert args.disaggregation_decode_enable_offload_kvcache


def test_clear_storage_clears_the_offloaded_pages(tmp_path):
    """/clear_hicache_storage_backend on a decode server with the offload flag (what the scheduler
    asks its KVCacheManager): the pages it wrote are removed, the tree is untouched, a later
    offload writes them again; a decode server without the flag still answers 'storage is off'."""
    from sglang.srt.managers.scheduler.cache_manager import KVCacheManager
    from sglang.srt.mem_cache.req_to_token import ReqToTokenPool

    decode, dpool, dalloc = side(decode_args(tmp_path))
    manager = KVCacheManager(ReqToTokenPool(4, 64), dalloc, decode)
    history = list(range(300, 314))
    finish_on_decode(decode, dpool, dalloc, history)
    assert decode.ostats.pages_written == 3
    out = manager.clear_storage()
    assert out.success and "3 page(s) removed" in out.message, out.message
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs]
    assert decode.match_prefix(history).prefix_len == 14 and accounting_ok(decode, dalloc)

    prefill, _, _ = side(prefill_args(tmp_path))
    assert prefill.match_and_load(history + [1]).prefix_len == 0  # gone from the store
    finish_on_decode(decode, dpool, dalloc, list(range(400, 410)), seed=2)
    assert decode.ostats.pages_written == 5

    from sglang.srt.server_args import ServerArgs

    plain, _, palloc = side(ServerArgs(model_path="m", load_format="dummy", disaggregation_mode="decode"))
    out = KVCacheManager(ReqToTokenPool(4, 64), palloc, plain).clear_storage()
    assert not out.success and "storage is off" in out.message
