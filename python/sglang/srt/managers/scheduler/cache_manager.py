"""KVCacheManager: the glue between requests and the token-level memory pools.

It owns no policy: the scheduler decides who runs; this component gives a request its
req_to_token row, seeds it from the radix cache, allocates KV slots for the tokens of a step
(evicting cached prefixes when needed) and returns everything when the request ends.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

import torch

from sglang.srt.managers.io_struct import ClearHiCacheReqOutput
from sglang.srt.managers.scheduler.schedule_batch import Req, ScheduledReq
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.hicache.decode_offload import OffloadingRadixCache
from sglang.srt.mem_cache.hicache.factory import RankPlace, create_prefix_cache, create_stage_tiers
from sglang.srt.mem_cache.hicache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.hicache.host_pool import CPShard
from sglang.srt.mem_cache.hicache.pipeline import Ring, RingPeers, StageTiers
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.mem_cache.req_to_token import ReqToTokenPool

logger = logging.getLogger(__name__)


def _layout_id(runner: Any, groups: Any) -> str:
    """This rank's place in the model (storage namespace): what decides its KV bytes (its rank and size
    in the attention tp group, pp stage, cp rank, dtype, layers), not its attention-DP replica: the
    replicas of a server share their L3 pages."""
    coords = groups.coords
    return (
        f"tp{coords.attn_tp}/{groups.layout.attn_tp}|pp{coords.pp}|cp{coords.attn_cp}|{runner.dtype}"
        f"|layers{runner.start_layer}-{runner.end_layer}"
        + ("" if runner.cp is None else f"|cp{runner.cp.mapping.cp_size}x{runner.cp.mapping.interleave}")
    )


def _agree_fn(group: Any) -> Optional[Callable[[int], int]]:
    """The minimum of a count over `group` (None for one rank)."""
    if group.size == 1:
        return None
    return lambda n: min(v[0] for v in group.all_gather_ints([n]))


def _gather_fn(group: Any) -> Optional[Callable[[list[int]], list[list[int]]]]:
    """Every rank's list of ints over `group` (None for one rank)."""
    return None if group.size == 1 else group.all_gather_ints


def _place(runner: Any, groups: Any) -> RankPlace:
    """This rank's place for HiCache's tiers; the replica's tp and cp ranks agree on L3 loads and
    on the storage prefetch's decisions."""
    shard = None if runner.cp is None else CPShard(runner.cp.mapping, groups.attn_cp.rank)
    group = groups.replica
    return RankPlace(
        runner.kv_page_size, _layout_id(runner, groups), _agree_fn(group), shard, _gather_fn(group)
    )


def build_prefix_cache(server_args: Any, runner: Any, groups: Any) -> RadixCache:
    """The rank's prefix cache: a radix cache, or HiCache's (mem_cache/hicache/) with its tiers.
    `runner`: the rank's ModelRunner (allocator, KV pool, page); `groups`: its ParallelGroups."""
    return create_prefix_cache(server_args, runner.allocator, runner.token_to_kv_pool, _place(runner, groups))


def build_stage_tiers(
    server_args: Any, runner: Any, groups: Any, agree_reads: Optional[Callable[[int], int]]
) -> Optional[StageTiers]:
    """A later pipeline stage's HiCache tiers (mem_cache/hicache/pipeline.py), None without HiCache;
    `agree_reads`: the minimum over the stage's tp ranks, for its storage I/O thread."""
    allocator_size = runner.max_total_num_tokens // runner.kv_page_size * runner.kv_page_size  # stage 0's
    place = dataclasses.replace(_place(runner, groups), agree=agree_reads)
    return create_stage_tiers(server_args, allocator_size, runner.token_to_kv_pool, place)


class KVCacheManager:
    def __init__(
        self, req_to_token_pool: ReqToTokenPool, allocator: TokenToKVPoolAllocator, tree: RadixCache
    ):
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree = tree
        self.page_size = allocator.page_size
        self.prefill_tokens_computed = 0  # prompt tokens run through the model (not from a cache)

    # ------------------------------------------------------------------ capacity
    def available_tokens(self) -> int:
        """Slots a new step could use: free slots plus what eviction could free."""
        return self.allocator.available_size() + self.tree.evictable_size()

    def free_slots(self) -> int:
        return self.allocator.available_size()

    # ------------------------------------------------------------------ admission
    def match_prefix_len(self, req: Req) -> int:
        """Cached prefix length the request would get (no side effects besides LRU touch)."""
        return self.tree.match_prefix(self._match_key(req)).prefix_len

    def admit(self, req: Req) -> bool:
        """Give the request a row and its cached prefix; False if no row is free."""
        rows = self.req_to_token_pool.alloc(1)
        if rows is None:
            return False
        req.req_pool_idx = rows[0]
        match = self.tree.match_and_load(self._match_key(req), req.rid)  # HiCache: loads lower tiers first
        n = int(match.indices.numel())
        if n:
            self.req_to_token_pool.req_to_token[req.req_pool_idx, :n] = match.indices
        self.tree.inc_lock_ref(match.last_node)
        req.last_node = match.last_node
        req.kv_len = req.cached_prefix_len = n
        if not req.output_ids:  # a retracted request re-admitted does not count as a cache hit
            req.cached_tokens = n
        return True

    # ------------------------------------------------------------------ storage prefetch (HiCache)
    def prefetch_waiting(self, waiting: list[Req], idle: bool) -> None:
        """Each step, before admission: take in finished prefetches and start one for each waiting
        request that has none (HiCache reads its storage pages in the background; the plain radix
        cache does nothing). `idle`: nothing runs (the cache may wait a moment for a prefetch)."""
        self.tree.poll_prefetches([r.rid for r in waiting] if idle else ())
        for req in waiting:
            if self.tree.wants_prefetch(req.rid) and not self.tree.prefetch(req.rid, self._match_key(req)):
                break  # the I/O queue is full: the rest start at a later step

    def prefetch_ready(self, req: Req) -> bool:
        """Whether the prefetch policy lets this waiting request be admitted now."""
        return self.tree.prefetch_ready(req.rid)

    def end_prefetch(self, req: Req) -> None:
        """A waiting request leaves without admission (abort): its prefetch is released."""
        self.tree.end_prefetch(req.rid)

    def _match_key(self, req: Req) -> list[int]:
        # Leave at least one token to compute so the request gets logits; while prompt logprobs
        # are missing, recompute the positions they come from (prompt_logprobs.py).
        limit = req.prompt_logprobs.max_prefix() if req.prompt_logprobs is not None else None
        return req.fill_ids[: -1 if limit is None else min(limit, req.seqlen - 1)]

    # ------------------------------------------------------------------ allocation
    def alloc_for_step(self, items: list[ScheduledReq]) -> Optional[torch.Tensor]:
        """KV slots for every token of the step, in item order; None if memory is short."""
        prefix_lens = [it.start for it in items]
        extend_lens = [it.num_tokens for it in items]
        last_locs = [self._last_loc(it.req) for it in items]
        need = self._pages_needed(prefix_lens, extend_lens) * self.page_size
        if need > self.allocator.available_size():
            self.tree.evict(need - self.allocator.available_size())
        out = self.allocator.alloc_extend(prefix_lens, extend_lens, last_locs)
        if out is None:
            return None
        table = self.req_to_token_pool.req_to_token
        offset = 0
        for it in items:
            table[it.req.req_pool_idx, it.start : it.start + it.num_tokens] = out[
                offset : offset + it.num_tokens
            ]
            offset += it.num_tokens
        self.prefill_tokens_computed += sum(it.num_tokens for it in items if it.req.is_prefilling)
        return out

    def _last_loc(self, req: Req) -> int:
        if req.kv_len == 0:
            return -1
        return int(self.req_to_token_pool.req_to_token[req.req_pool_idx, req.kv_len - 1])

    def _pages_needed(self, prefix_lens: list[int], extend_lens: list[int]) -> int:
        p = self.page_size
        return sum(-(-(pre + ext) // p) - (-(-pre // p)) for pre, ext in zip(prefix_lens, extend_lens))

    # ------------------------------------------------------------------ release
    def release(self, req: Req) -> None:
        """Return a request's KV: valid full pages go into the radix cache, the rest is freed."""
        if req.req_pool_idx is None:
            return
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        kv_len = req.kv_len
        indices = row[:kv_len].clone()
        if self.tree.disable:
            self.allocator.free(indices[req.cached_prefix_len :])
        else:
            aligned = kv_len // self.page_size * self.page_size
            key = req.fill_ids[:aligned]
            already = self.tree.insert(key, indices[:aligned])
            if already > req.cached_prefix_len:  # duplicates of what another request cached
                self.allocator.free(indices[req.cached_prefix_len : already])
            if kv_len > aligned:
                self.allocator.free(indices[aligned:kv_len])
        self.tree.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.reset_memory_state()

    def internal_state(self) -> dict:
        """Counters for /get_server_info: prefill tokens computed, the prefix cache's tier hits."""
        return {"prefill_tokens_computed": self.prefill_tokens_computed, **self.tree.stats()}

    def clear_storage(self) -> ClearHiCacheReqOutput:
        """Delete this rank's L3 pages (any time: L3 pages are looked up by hash, never held by the
        tree, so a page gone is a miss and recomputed): HiCache's, or the pages a PD decode server
        offloads (--disaggregation-decode-enable-offload-kvcache). Refused when storage is off."""
        if not isinstance(self.tree, (HiRadixCache, OffloadingRadixCache)) or self.tree.storage is None:
            return ClearHiCacheReqOutput(False, "HiCache storage is off (--hicache-storage-backend)")
        removed = self.tree.clear_storage()
        if self.tree.agree is not None:  # a collective: every rank has cleared before the entry rank answers
            self.tree.agree(removed)
        return ClearHiCacheReqOutput(True, f"{removed} page(s) removed (entry rank; every rank cleared)")

    def attach_pipeline(self, ring: Ring) -> bool:
        """Pipeline stage 0: HiCache's tier copies are recorded for the later stages and storage
        prefetches ask them to read their pages (mem_cache/hicache/pipeline.py); False without
        HiCache."""
        if not isinstance(self.tree, HiRadixCache):
            return False
        self.tree.enable_pipeline(RingPeers(ring))
        return True

    def take_tier_ops(self) -> list:
        """HiCache's tier copies the later pipeline stages have yet to replay (in order)."""
        return self.tree.take_ops() if isinstance(self.tree, HiRadixCache) else []

    def flush(self) -> None:
        """Drop the whole cache (only valid when no request holds KV)."""
        self.tree.reset()
        self.allocator.clear()
        self.req_to_token_pool.clear()
