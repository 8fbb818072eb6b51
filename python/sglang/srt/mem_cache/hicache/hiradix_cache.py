"""HiRadixCache: the radix cache with an L2 host tier and an optional L3 storage backend.

Where a node's KV lives: `node.value` (L1 device slots, or None), `node.host_value` (L2 host
slots, or None); L3 pages are found by the hash chain of their tokens (`PageStore`), not kept
in the tree. Invariants:
  * every node is in L1 or L2 (a node losing its last tier is removed with its subtree);
  * L1 is prefix-closed: a node in L1 has its parent in L1 (eviction takes L1 leaves first,
    loads fill a path from the root), so a match is an L1 run followed by an L2-only run.
Write policies: `write_through` copies a node to L2 when it is inserted, `write_back` when it is
evicted from L1, `write_through_selective` on its second hit (a node never copied is dropped on
eviction). A page reaches L3 when its node reaches L2.

`match_prefix` (the scheduler's estimates) sees L1 only. `match_and_load` (admission) also loads
the L2 part of the match and then the L3 pages that continue it into freshly allocated L1 slots;
what does not fit, or fails its checksum, is left out and recomputed. With a storage prefetch
(`prefetch.py`: a waiting request's L3 pages read into L2 by an I/O thread) the L3 part of an
admission is what its prefetch brought, landed in the tree as L2 nodes; the prefetch runs on a
rank alone, under tp / cp (`gather`: the ranks agree on what it changes, prefetch.py) and on a
pipeline's stage 0 (the later stages read their pages too, pipeline.py); without one (`agree`
but no `gather`, or no prefetch config) the L3 load is synchronous at admission. Either way,
when admission returns the request holds nothing in flight. `agree` (tp / cp > 1) turns a rank's
count of readable L3 pages into the count every rank uses (the minimum), so ranks stay identical.
An admission walks the tree once (the landing's walk, or the load's).
Under pipeline parallelism (`enable_pipeline`, pipeline.py) the tree lives on stage 0 only: every
copy between tiers is also recorded as a `TierOp` the later stages replay on their layers, and a
prefetch lands only the pages every stage has read.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.hicache.page_store import PageStore, write_missing
from sglang.srt.mem_cache.hicache.host_pool import HostKVPool
from sglang.srt.mem_cache.hicache.prefetch import Gather, PrefetchConfig, StoragePrefetch
from sglang.srt.mem_cache.hicache.pipeline import Backup, ClearStorage, Restore, RingPeers, StorePages, TierOp
from sglang.srt.mem_cache.radix_cache import MatchResult, RadixCache, TreeNode

logger = logging.getLogger(__name__)

SELECTIVE_HITS = 2  # write_through_selective: copy to L2 at this many hits


@dataclass
class HiCacheStats:
    l1_hit_tokens: int = 0  # admitted prefix tokens already in the KV pool
    l2_hit_tokens: int = 0  # ... loaded from the host tier
    l3_hit_tokens: int = 0  # ... loaded from storage
    l2_backup_tokens: int = 0  # tokens copied L1 -> L2
    l2_evicted_tokens: int = 0  # tokens dropped from L2
    l1_dropped_tokens: int = 0  # tokens evicted from L1 with no L2 copy (forgotten)
    load_failures: int = 0  # loads cut short (no L1 room)
    # the scheduler's time at admission loading L2 / L3 into L1 (the copies: the loader's)
    load_seconds: float = 0.0
    backup_seconds: float = 0.0  # time spent copying L1 -> L2, storage writes included
    storage_write_seconds: float = 0.0  # ... of it writing L3 pages (pack, checksum, backend)
    # pipeline parallelism: L3 pages stage 0 could read but another stage could not (recomputed),
    # and the bad pages the other stages met while answering
    peer_missing_pages: int = 0
    peer_read_failures: int = 0


class HiRadixCache(RadixCache):
    def __init__(
        self,
        allocator: TokenToKVPoolAllocator,
        page_size: int,
        host: HostKVPool,
        write_policy: str = "write_through",
        storage: Optional[PageStore] = None,
        agree: Optional[Callable[[int], int]] = None,
        prefetch: Optional[PrefetchConfig] = None,
        gather: Optional[Gather] = None,
    ):
        self.host = host
        self.write_policy = write_policy
        self.storage = storage
        self.agree = agree
        self.gather = gather  # every rank's ints (tp / cp > 1): the prefetch's agreement
        self.hstats = HiCacheStats()
        self.peers: Optional[RingPeers] = None  # pipeline parallelism (stage 0): the later stages
        self._ops: Optional[list[TierOp]] = None  # ... and the copies they have yet to replay
        self.prefetcher: Optional[StoragePrefetch] = None
        super().__init__(allocator, page_size)
        if prefetch is not None and storage is not None:
            self.prefetcher = StoragePrefetch(self, prefetch, gather)

    def enable_pipeline(self, peers: RingPeers) -> None:
        """Stage 0 of a pipeline: record tier copies for the later stages; L3 pages come through
        the storage prefetch, which asks them to read theirs too (pipeline.py)."""
        if self.storage is not None and not self._prefetching():
            raise ValueError("HiCache under pipeline parallelism reads storage through its prefetch only")
        self.peers, self._ops = peers, []

    def take_ops(self) -> list[TierOp]:
        """The tier copies recorded since the last call (the ring sends them on, in order)."""
        ops, self._ops = (self._ops, []) if self._ops is not None else ([], None)
        return ops

    def clear_storage(self) -> int:
        """Delete this rank's L3 pages (and, in a pipeline, the later stages' with the next ops)."""
        self._record(ClearStorage())
        return self.storage.clear()

    def _record(self, op: TierOp) -> None:
        if self._ops is not None:
            self._ops.append(op)

    def reset(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.drain()  # the I/O thread lets go of every host row first
        super().reset()
        self.host.clear()

    def close(self) -> None:
        """Stop the prefetch thread (its tasks cancelled, their rows freed) and the layer loader's."""
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.host.close()

    # ------------------------------------------------------------------ storage prefetch
    def _prefetching(self) -> bool:
        """Whether L3 pages come from a background prefetch (else: synchronously at admission).
        The one place that decides: a rank alone, or tp / cp peers that can `gather` (they agree
        on every decision, prefetch.py); a pipeline's stage 0 always (`enable_pipeline`)."""
        return self.prefetcher is not None and (self.agree is None or self.gather is not None)

    def wants_prefetch(self, rid: str) -> bool:
        return self._prefetching() and self.prefetcher.wants(rid)

    def prefetch(self, rid: str, key: Sequence[int]) -> bool:
        return self.prefetcher.start(rid, key)

    def poll_prefetches(self, idle_rids: Sequence[str] = ()) -> None:
        if self._prefetching():
            self.prefetcher.poll()
            if self.prefetcher.waiting_only(idle_rids):
                self.prefetcher.wait(0.005)  # nothing to run: no spinning against the I/O thread

    def prefetch_ready(self, rid: str) -> bool:
        return not self._prefetching() or self.prefetcher.ready(rid)

    def end_prefetch(self, rid: str) -> None:
        if self.prefetcher is not None:
            self.prefetcher.end(rid)

    # ------------------------------------------------------------------ residence bookkeeping
    def _node_len(self, node: TreeNode) -> int:
        return len(node.key) if node.value is not None else 0

    def _set_device(self, node: TreeNode, slots: torch.Tensor) -> None:
        node.value = slots
        if node.lock_ref:
            self._protected += len(node.key)
        else:
            self._evictable += len(node.key)

    def total_size(self) -> int:
        """Tokens in L1 (equals evictable + protected)."""
        return sum(self._node_len(n) for n in self._all_nodes())

    def host_size(self) -> int:
        """Tokens held in L2."""
        return sum(len(n.key) for n in self._all_nodes() if n.host_value is not None)

    def stats(self) -> dict:
        out = {f"hicache_{k}": v for k, v in asdict(self.hstats).items()}
        token_bytes = self.host.layout.token_bytes()
        out["hicache_loaded_bytes"] = (self.hstats.l2_hit_tokens + self.hstats.l3_hit_tokens) * token_bytes
        out["hicache_backup_bytes"] = self.hstats.l2_backup_tokens * token_bytes
        out["hicache_host_tokens"] = self.host.size - self.host.available_size()
        out["hicache_host_capacity"] = self.host.size
        if self.host.loader is not None:  # L2 -> L1 copies, on the loader's thread beside the forward
            out["hicache_layer_load_seconds"] = self.host.loader.busy_seconds
        if self.storage is not None:
            out.update({f"hicache_storage_{k}": v for k, v in self.storage.stats.snapshot().items()})
        if self.prefetcher is not None:
            out.update({f"hicache_{k}": v for k, v in asdict(self.prefetcher.stats).items()})
        return out

    # ------------------------------------------------------------------ matching
    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """The L1 part of the longest cached prefix (no load)."""
        return self._result([n for n in self._walk(key) if n.value is not None])

    def match_and_load(self, key: Sequence[int], rid: Optional[str] = None) -> MatchResult:
        """Load the match's L2 nodes, then the L3 pages that continue it, into L1; the L1 match.
        With a storage prefetch, request `rid`'s L3 pages are those its prefetch landed in L2.
        One walk of the tree: the landing's (when the pages land now), else the load's."""
        if rid is None or not self._prefetching():
            # a pipeline reads storage through the prefetch only: the later stages read their pages
            return self._match_and_load(key, sync_storage=self.peers is None)[0]
        task, path = self.prefetcher.take(rid, key)
        match, l1 = self._match_and_load(key, sync_storage=False, path=path)
        if task is not None:
            self.prefetcher.release(task)
            hit = min(match.prefix_len, task.landed) - max(task.land_start, l1)
            if hit > 0:  # loaded through L2, but storage's: counted as L3 hits
                self.hstats.l2_hit_tokens -= hit
                self.hstats.l3_hit_tokens += hit
                self.prefetcher.stats.prefetch_hit_tokens += hit
        return match

    def _match_and_load(
        self, key: Sequence[int], sync_storage: bool, path: Optional[list[TreeNode]] = None
    ) -> tuple[MatchResult, int]:
        """The L1 match after loading (and the tokens that were in L1 before); `path`: `key`'s
        walk when the caller has just made it."""
        path = self._walk(key) if path is None else path
        for node in path:
            node.hit_count += 1
        l1 = sum(len(n.key) for n in path if n.value is not None)  # L1 is prefix-closed
        self.hstats.l1_hit_tokens += l1
        last = path[-1] if path else self.root_node
        self.inc_lock_ref(last)  # nothing on the path is evicted (from L1 or L2) while loading
        t0 = time.perf_counter()
        try:
            loaded_all = self._load_from_host([n for n in path if n.value is None])
            if loaded_all and self.storage is not None and sync_storage:
                leaf = self._load_from_storage(key, path)
                path = path if leaf is None else [*path, leaf]
            if self.write_policy == "write_through_selective":
                for node in path:
                    if node.hit_count >= SELECTIVE_HITS and node.value is not None:
                        self._backup(node)
        finally:
            self.dec_lock_ref(last)
            self.hstats.load_seconds += time.perf_counter() - t0
        return self._result([n for n in path if n.value is not None]), l1

    def _load_from_host(self, nodes: list[TreeNode]) -> bool:
        for node in nodes:
            slots = self._alloc_device(len(node.key))
            if slots is None:
                self.hstats.load_failures += 1
                return False
            self.host.restore(node.host_value, slots)
            self._record(Restore(node.host_value.tolist(), slots.tolist()))
            self._set_device(node, slots)
            self.hstats.l2_hit_tokens += len(node.key)
        return True

    def _load_from_storage(self, key: Sequence[int], path: list[TreeNode]) -> Optional[TreeNode]:
        """Load the storage pages (`storage.page_size` tokens each) that continue the L1 prefix
        `path` holds; the first may overlap it (its overlapping rows are skipped). The new leaf
        holding them (None: none loaded)."""
        sp, start = self.storage.page_size, sum(len(n.key) for n in path)
        total, p0 = len(key) // sp, start // sp
        if total <= p0:
            return None
        names = self.storage.page_hashes(key, total)
        pages = self.storage.get_run(names[p0:])
        n = len(pages) if self.agree is None else self.agree(len(pages))
        skip = start - p0 * sp
        slots = self._alloc_device(n * sp - skip) if n else None
        if n and slots is None:
            self.hstats.load_failures += 1
        if slots is not None and not self._unpack(pages[:n], slots, skip):
            self.allocator.free(slots)
            slots = None
        if slots is None:
            return None
        # no child of the path's end continues `key` (the walk would have taken it), and the
        # locked path kept every node: the pages become a new leaf there
        leaf = self._new_child(path[-1] if path else self.root_node, key[start : (p0 + n) * sp])
        self._on_new_leaf(leaf, slots)
        self.hstats.l3_hit_tokens += slots.numel()
        return leaf

    def _unpack(self, pages: list[bytes], slots: torch.Tensor, skip: int) -> bool:
        sp = self.storage.page_size
        try:
            for i, page in enumerate(pages):
                dst = slots[max(0, i * sp - skip) : (i + 1) * sp - skip]
                self.host.unpack(dst, page, skip if i == 0 else 0)
        except ValueError as e:  # a page of another size under the same name: recompute
            logger.warning("HiCache: storage page rejected (%s); recomputing", e)
            self.storage.stats.add("read_failures")
            return False
        return True

    # ------------------------------------------------------------------ insert
    def _on_path(self, path: list[TreeNode], value: torch.Tensor) -> int:
        """An L2-only node on an inserted path takes the caller's slots (it is in L1 again); the
        length already in L1 is returned (the caller frees its duplicates there)."""
        matched = offset = 0
        for node in path:
            n = len(node.key)
            if node.value is None:
                self._set_device(node, value[offset : offset + n].clone())  # its L2 copy stays
            else:
                assert matched == offset, "L1 is prefix-closed"
                matched += n
            offset += n
        return matched

    def _on_new_leaf(self, leaf: TreeNode, value: torch.Tensor) -> None:
        leaf.value = None
        self._set_device(leaf, value)
        if self.write_policy == "write_through":
            self._backup(leaf)

    # ------------------------------------------------------------------ tiers
    def _alloc_device(self, n: int) -> Optional[torch.Tensor]:
        if n > self.allocator.available_size():
            self.evict(n - self.allocator.available_size())
        return self.allocator.alloc(n)

    def _backup(self, node: TreeNode) -> bool:
        """Copy an L1 node to L2 (and its pages to L3); False when L2 has no room."""
        if node.host_value is not None:
            return True
        n = len(node.key)
        if n > self.host.available_size():
            self._evict_host(n - self.host.available_size())
        slots = self.host.alloc(n)
        if slots is None:
            return False
        t0 = time.perf_counter()
        self.host.backup(node.value, slots)
        self._record(Backup(node.value.tolist(), slots.tolist()))
        node.host_value = slots
        self.hstats.l2_backup_tokens += n
        if self.storage is not None:
            t1 = time.perf_counter()
            self._write_storage(node)
            self.hstats.storage_write_seconds += time.perf_counter() - t1
        self.hstats.backup_seconds += time.perf_counter() - t0
        return True

    def _path(self, node: TreeNode) -> list[TreeNode]:
        """Root-first nodes from the root down to `node`."""
        out = []
        while node is not self.root_node:
            out.append(node)
            node = node.parent  # type: ignore[assignment]
        return out[::-1]

    def _write_storage(self, node: TreeNode) -> None:
        """Write the storage pages completed by an L1 node (its ancestors are in L1 too) that the
        backend lacks; a page starting in an ancestor is written once this node completes it."""
        path = self._path(node)
        tokens = [t for n in path for t in n.key]
        sp = self.storage.page_size
        end, first = len(tokens) // sp, (len(tokens) - len(node.key)) // sp
        if first >= end:
            return
        names = self.storage.page_hashes(tokens, end)
        slots = None
        if self._ops is not None:  # every stage writes the pages its own namespace lacks
            slots = torch.cat([n.value for n in path])
            self._record(StorePages(tokens[: end * sp], first, end, slots[: end * sp].tolist()))
        present = self.storage.exists_many(names[first:end])
        if all(present):
            return
        rows = slots if slots is not None else torch.cat([n.value for n in path])
        pack = self.host.pack
        write_missing(
            self.storage,
            names[first:end],
            present,
            lambda i: pack(rows[(first + i) * sp : (first + i + 1) * sp]),
        )

    def evict(self, num_tokens: int) -> int:
        """Free L1 slots from LRU unlocked L1 leaves: demote to L2, or drop when there is no copy."""
        if num_tokens <= 0:
            return 0
        return self._evict_lru(self._l1_leaf, self._demote, num_tokens)

    def _demote(self, node: TreeNode) -> int:
        if node.host_value is None and self.write_policy != "write_through_selective":
            self._backup(node)
        n = len(node.key)
        self.allocator.free(node.value)
        node.value = None
        self._evictable -= n
        if node.host_value is None:
            self.hstats.l1_dropped_tokens += n
            self._drop(node)
        return n

    def _l1_leaf(self, node: TreeNode) -> bool:
        return self._tier_leaf(node, "value")

    @staticmethod
    def _tier_leaf(node: TreeNode, tier: str) -> bool:
        """Unlocked, held in `tier` ("value": L1, "host_value": L2), no child held there."""
        held = lambda n: getattr(n, tier) is not None  # noqa: E731
        return held(node) and node.lock_ref == 0 and not any(held(c) for c in node.children.values())

    def _evict_host(self, num_tokens: int) -> int:
        """Free L2 slots from LRU unlocked nodes with no L2 child: an L1 node keeps its L1 copy, an
        L2-only node (then a leaf) leaves the tree."""
        return self._evict_lru(self._l2_leaf, self._forget_host, num_tokens)

    def _forget_host(self, node: TreeNode) -> int:
        self.host.free(node.host_value)
        node.host_value = None
        self.hstats.l2_evicted_tokens += len(node.key)
        if node.value is None:
            self._drop(node)
        return len(node.key)

    def _l2_leaf(self, node: TreeNode) -> bool:
        return self._tier_leaf(node, "host_value")

    def _drop(self, node: TreeNode) -> None:
        """Remove a node that is in no tier, and its subtree (then L2-only: L1 is prefix-closed)."""
        parent = node.parent
        assert parent is not None and node.value is None
        del parent.children[self._child_key(node.key)]
        stack = list(node.children.values())
        while stack:
            sub = stack.pop()
            assert sub.value is None and sub.lock_ref == 0
            if sub.host_value is not None:
                self.host.free(sub.host_value)
                self.hstats.l2_evicted_tokens += len(sub.key)
            stack.extend(sub.children.values())
