"""The prefix cache a scheduler holds: `RadixCache`, or `HiRadixCache` with --enable-hierarchical-cache.

Sizes: the host tier holds `--hicache-size` GB (per rank), else `--hicache-ratio` × the KV pool's
tokens. The file backend's directory: the extra config's `file_path`, else
`SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`, else `/tmp/hicache` (bounded by `capacity_gb` /
`ttl_seconds`: file_storage.FileLimits); the `mooncake` backend's store:
`mooncake_config.py`. One storage page holds `page_tokens` tokens (extra config, default 64).
The storage prefetch (prefetch.py) takes --hicache-storage-prefetch-policy and the extra config's
`prefetch_timeout_base` / `prefetch_timeout_per_ki_token`.
`layout_id` names this rank's place in the model (tp rank/size, pp stage, cp rank and layout,
dtype, layers): it goes into the storage namespace with `model_identity`, the page size and the KV
buffers' shapes. A later pipeline stage builds the same tiers for its layers as a `StageTiers`
(pipeline.py). A PD decode server with --disaggregation-decode-enable-offload-kvcache gets an
`OffloadingRadixCache` (decode_offload.py): no host tier, the same storage namespace, so the pages
it writes are the ones a prefill server of the same model and layout reads.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

from sglang.srt import envs
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.hicache.decode_offload import OffloadingRadixCache
from sglang.srt.mem_cache.hicache.file_storage import FileLimits, FileStorage
from sglang.srt.mem_cache.hicache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.hicache.host_pool import (
    CPShard,
    HostKVPool,
    TokenLayout,
    copy_rows,
    kv_token_buffers,
)
from sglang.srt.mem_cache.hicache.layer_load import LayerLoader, Loader, StreamLoader, layer_groups
from sglang.srt.mem_cache.hicache.mooncake_config import mooncake_config
from sglang.srt.mem_cache.hicache.mooncake_storage import MooncakeStorage
from sglang.srt.mem_cache.hicache.page_store import PageStore
from sglang.srt.mem_cache.hicache.prefetch import Gather, PrefetchConfig
from sglang.srt.mem_cache.hicache.pipeline import StageTiers
from sglang.srt.mem_cache.radix_cache import RadixCache

DEFAULT_FILE_DIR = "/tmp/hicache"


def host_pool_tokens(args: Any, device_tokens: int, token_bytes: int, page_size: int, cp: int = 1) -> int:
    """Host tier tokens (virtual under context parallelism: a rank holds 1/cp of them)."""
    size = (
        int(args.hicache_size * 1e9) // token_bytes * cp
        if args.hicache_size > 0
        else int(device_tokens * args.hicache_ratio)
    )
    return max(page_size, size // page_size * page_size)


def storage_page_tokens(args: Any, page_size: int) -> int:
    """Tokens per storage page (one file): the extra config's `page_tokens` (default 64), rounded
    up to a multiple of the KV page."""
    want = int(json.loads(args.hicache_storage_backend_extra_config or "{}").get("page_tokens", 64))
    return -(-max(1, want) // page_size) * page_size


def storage_dir(args: Any) -> str:
    extra = json.loads(args.hicache_storage_backend_extra_config or "{}")
    return extra.get("file_path") or envs.SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR.get() or DEFAULT_FILE_DIR


def model_identity(args: Any) -> str:
    """What makes two servers' KV for the same tokens equal, besides the rank's layout: the
    checkpoint (path, revision, quantization; dummy weights: their seed). A checkpoint rewritten
    in place at the same path is not noticed: clear the directory then."""
    ident = f"{args.model_path}@{args.revision}|{args.load_format}|{args.quantization}"
    return ident + (f"|seed{args.random_seed}" if args.load_format == "dummy" else "")


@dataclass
class RankPlace:
    """A rank's place for its tiers: the KV page (the allocator's: virtual under context
    parallelism), the layout id of its storage namespace, the cross-rank minimum of a count (tp /
    cp > 1: every rank loads the same L3 pages), its CP share of the slots, and every rank's ints
    (`gather`, tp / cp > 1: the storage prefetch's agreement)."""

    page_size: int
    layout_id: str
    agree: Optional[Callable[[int], int]] = None
    shard: Optional[CPShard] = None
    gather: Optional[Gather] = None  # every rank's ints (tp / cp > 1): the storage prefetch agrees


def _namespace(args: Any, place: RankPlace, layout: TokenLayout) -> str:
    """The storage namespace of a rank: checkpoint, layout, KV page, buffer shapes."""
    return f"{model_identity(args)}|{place.layout_id}|page{place.page_size}|{layout.describe()}"


def layer_loader(layers: list[list[int]], platform: Any) -> Loader:
    """The rank's layer-by-layer loader: copy-stream events where the platform copies
    asynchronously (accelerators, pinned host memory), else a copying thread (CPU)."""
    if platform.async_copies:
        return StreamLoader(layers, functools.partial(copy_rows, non_blocking=True), platform)
    return LayerLoader(layers, copy_rows)


def _tiers(args: Any, kv_pool: Any, device_tokens: int, place: RankPlace):
    """The host pool and the storage backend (None) of one rank. Restores into the KV pool run
    layer by layer beside the forward (layer_load.py): the pool's accessors wait for their layer."""
    buffers = kv_token_buffers(kv_pool)
    layout = TokenLayout(buffers)
    page, shard = place.page_size, place.shard
    cp = 1 if shard is None else shard.mapping.cp_size
    from sglang.srt.platforms import get_platform  # (as kv_pool.py: platforms load the kernels)

    platform = get_platform(kv_pool.device.type)
    loader = layer_loader(layer_groups(len(buffers), kv_pool.layer_num), platform)
    kv_pool.attach_layer_gate(loader)
    tokens = host_pool_tokens(args, device_tokens, layout.token_bytes(), page, cp)
    host = HostKVPool(buffers, tokens, page, shard=shard, loader=loader, zeros=platform.host_zeros)
    return host, _storage(args, _namespace(args, place, layout), page, host.page_bytes)


def _storage(
    args: Any, namespace: str, kv_page: int, page_bytes: Callable[[int], int]
) -> Optional[PageStore]:
    """The rank's L3 backend (None without one); `namespace` names its model and layout;
    `page_bytes(tokens)`: a storage page's payload size on this rank."""
    tokens = storage_page_tokens(args, kv_page)
    if args.hicache_storage_backend == "file":
        limits = FileLimits.from_extra(json.loads(args.hicache_storage_backend_extra_config or "{}"))
        return FileStorage(storage_dir(args), namespace, tokens, limits)
    if args.hicache_storage_backend == "mooncake":
        config = mooncake_config(json.loads(args.hicache_storage_backend_extra_config or "{}"))
        return MooncakeStorage(config, namespace, tokens, page_bytes(tokens))
    return None


def _offloading_cache(
    args: Any, allocator: TokenToKVPoolAllocator, kv_pool: Any, place: RankPlace
) -> OffloadingRadixCache:
    """A decode server's radix cache that writes finished requests' pages to storage."""
    buffers = kv_token_buffers(kv_pool)
    layout = TokenLayout(buffers)
    shard = place.shard
    cp = 1 if shard is None else shard.mapping.cp_size

    def pack(slots):
        return layout.pack(buffers, *((slots,) if shard is None else shard.local(slots)))

    storage = _storage(
        args, _namespace(args, place, layout), place.page_size, lambda t: t // cp * layout.token_bytes()
    )
    return OffloadingRadixCache(allocator, place.page_size, storage, pack, place.agree)


def create_prefix_cache(
    args: Any, allocator: TokenToKVPoolAllocator, kv_pool: Any, place: RankPlace
) -> RadixCache:
    """`args`: the ServerArgs; `kv_pool`: the device KV pool."""
    if args.disaggregation_decode_enable_offload_kvcache:
        return _offloading_cache(args, allocator, kv_pool, place)
    if not args.enable_hierarchical_cache:
        return RadixCache(allocator, place.page_size, disable=args.disable_radix_cache)
    host, storage = _tiers(args, kv_pool, allocator.size, place)
    return HiRadixCache(
        allocator,
        place.page_size,
        host,
        args.hicache_write_policy,
        storage,
        place.agree,
        prefetch_config(args),
        place.gather,
    )


def prefetch_config(args: Any) -> PrefetchConfig:
    """--hicache-storage-prefetch-policy and the extra config's prefetch_timeout_* keys."""
    extra = json.loads(args.hicache_storage_backend_extra_config or "{}")
    return PrefetchConfig.from_extra(args.hicache_storage_prefetch_policy, extra)


def create_stage_tiers(args: Any, device_tokens: int, kv_pool: Any, place: RankPlace) -> Optional[StageTiers]:
    """A later pipeline stage's tiers (pipeline.py), sized like stage 0's (`device_tokens`: its
    allocator's size); None without HiCache."""
    if not args.enable_hierarchical_cache:
        return None
    return StageTiers(*_tiers(args, kv_pool, device_tokens, place), place.agree)
