"""RadixCache: a radix tree over token ids whose values are KV slot indices (prefix cache).

Token-level only: it knows nothing about requests. Callers (the scheduler's cache glue):
  * `match_prefix(tokens)` -> slots of the longest cached prefix + the deepest node;
  * `inc_lock_ref(node)` while a request uses that prefix, `dec_lock_ref(node)` when done;
  * `insert(tokens, slots)` when a request's KV should be shared; it returns how many leading
    tokens were already cached, and the caller frees its own duplicate slots for that range;
  * `evict(n)` when the allocator runs low.
`match_and_load(tokens)` is the match a request is admitted with (here the same as
`match_prefix`; `hicache.HiRadixCache` loads lower-tier pages back first); the `prefetch` methods
let HiCache read a waiting request's storage pages in the background (no-ops here).

Paging: with page_size > 1 keys are handled in whole pages. `match_prefix` and `insert` both
truncate the key (and value) to floor(len / page_size) * page_size themselves; the caller keeps
ownership of the slots of the unaligned tail. Node boundaries always fall on page multiples, so
every node owns whole pages and eviction can free them through the allocator.

Flush: `reset()` only clears the tree (frees nothing). A full flush, done by the caller when no
request is running, is `allocator.clear()` + `req_to_token_pool.clear()` + `radix_cache.reset()`.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator


class TreeNode:
    """A node holding a run of tokens (`key`) and their KV slots (`value`)."""

    def __init__(
        self,
        node_id: int = 0,
        key: tuple[int, ...] = (),
        value: Optional[torch.Tensor] = None,
        parent: Optional["TreeNode"] = None,
    ):
        self.id = node_id  # unique within one cache; LRU tie-breaker
        self.key = key
        self.value = value if value is not None else torch.empty(0, dtype=torch.int64)
        self.parent = parent
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.host_value: Optional[torch.Tensor] = None  # HiCache: L2 host slots (hicache/)
        self.hit_count = 0  # HiCache: prefix hits (write_through_selective)

    def is_leaf(self) -> bool:
        return not self.children

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock={self.lock_ref})"


@dataclass
class MatchResult:
    indices: torch.Tensor  # int64 KV slots of the matched prefix (page-aligned length)
    last_node: TreeNode  # deepest matched node (root when nothing matched)

    @property
    def prefix_len(self) -> int:
        return int(self.indices.numel())


class RadixCache:
    def __init__(self, allocator: TokenToKVPoolAllocator, page_size: int = 1, disable: bool = False):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self.disable = disable
        self._clock = itertools.count(1)  # logical LRU clock: deterministic ordering
        self._node_ids = itertools.count(1)
        self.reset()

    # ------------------------------------------------------------------ helpers
    def reset(self) -> None:
        """Drop the whole tree without freeing any slot (see module docstring for flush)."""
        self.root_node = TreeNode(0)
        self.root_node.lock_ref = 1  # root is never evicted
        self._evictable = 0
        self._protected = 0

    def _aligned(self, n: int) -> int:
        return n // self.page_size * self.page_size

    def _child_key(self, key: Sequence[int]) -> tuple[int, ...]:
        return tuple(key[: self.page_size])

    def _match_len(self, a: tuple[int, ...], b: tuple[int, ...]) -> int:
        """Length of the common prefix of a and b, rounded down to whole pages."""
        n = min(len(a), len(b))
        if a[:n] == b[:n]:
            return self._aligned(n)
        i = 0
        while a[i] == b[i]:
            i += 1
        return self._aligned(i)

    def _split(self, child: TreeNode, split_len: int) -> TreeNode:
        """Split `child` so that its first `split_len` tokens become a new parent node (each tier's
        slots, `value` and HiCache's `host_value`, split with it)."""
        parent = child.parent
        assert parent is not None and 0 < split_len < len(child.key)
        head = TreeNode(next(self._node_ids), child.key[:split_len], None, parent)
        for attr in ("value", "host_value"):
            v = getattr(child, attr)
            setattr(head, attr, None if v is None else v[:split_len].clone())
            setattr(child, attr, None if v is None else v[split_len:].clone())
        head.lock_ref, head.last_access, head.hit_count = child.lock_ref, child.last_access, child.hit_count
        child.key = child.key[split_len:]
        child.parent = head
        head.children[self._child_key(child.key)] = child
        parent.children[self._child_key(head.key)] = head
        return head

    def _walk(self, key: Sequence[int]) -> list[TreeNode]:
        """The nodes matching the page-aligned part of `key`, root first (LRU-touched), splitting
        the last one where the match ends inside it."""
        rest = tuple(key[: self._aligned(len(key))])
        node, path = self.root_node, []
        self._now = now = next(self._clock)
        node.last_access = now
        while rest:
            child = node.children.get(self._child_key(rest))
            if child is None:
                break
            child.last_access = now
            n = self._match_len(child.key, rest)
            if n < len(child.key):
                path.append(self._split(child, n))
                break
            path.append(child)
            node, rest = child, rest[n:]
        return path

    def _node_len(self, node: TreeNode) -> int:
        """Tokens a node holds in the KV pool (HiCache: 0 for a node held in a lower tier only)."""
        return len(node.key)

    def _evict_lru(self, is_candidate, take, num_tokens: int) -> int:
        """Apply `take(node)` (tokens freed) to LRU `is_candidate` nodes until `num_tokens` are
        freed; a parent becomes a candidate once its children are gone."""
        heap = [(n.last_access, n.id, n) for n in self._all_nodes() if is_candidate(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            freed += take(node)
            if parent is not self.root_node and is_candidate(parent):
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    # ------------------------------------------------------------------ API
    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """Longest cached page-aligned prefix of `key`; splits a node the match ends inside."""
        if self.disable:
            return MatchResult(torch.empty(0, dtype=torch.int64), self.root_node)
        return self._result(self._walk(key))

    def _result(self, path: list[TreeNode]) -> MatchResult:
        if not path:
            return MatchResult(torch.empty(0, dtype=torch.int64), self.root_node)
        return MatchResult(torch.cat([n.value for n in path]), path[-1])

    def match_and_load(self, key: Sequence[int], rid: Optional[str] = None) -> MatchResult:
        """The match request `rid` is admitted with. Here `match_prefix`; HiCache first loads the
        prefix's lower-tier pages back into the KV pool (hicache/hiradix_cache.py)."""
        return self.match_prefix(key)

    # Storage prefetch while a request waits (HiCache: hicache/prefetch.py); no-ops here.
    def wants_prefetch(self, rid: str) -> bool:
        """Whether a prefetch for waiting request `rid` is still to be started."""
        return False

    def prefetch(self, rid: str, key: Sequence[int]) -> bool:
        """Start loading the lower-tier pages of `key` for `rid`; False: try again later."""
        return True

    def poll_prefetches(self, idle_rids: Sequence[str] = ()) -> None:
        """Take in finished prefetches; `idle_rids`: the waiting requests of a scheduler with
        nothing running (it may sleep briefly when each of them waits on its prefetch)."""

    def prefetch_ready(self, rid: str) -> bool:
        """Whether the prefetch policy lets waiting request `rid` be admitted now."""
        return True

    def end_prefetch(self, rid: str) -> None:
        """Request `rid` left the waiting queue without admission: release its prefetch."""

    def stats(self) -> dict:
        """Counters for the scheduler's internal state (HiCache's per tier; none here)."""
        return {}

    def insert(self, key: Sequence[int], value: torch.Tensor) -> int:
        """Insert key -> slots (page-aligned part only); return the already-cached prefix length."""
        if self.disable:
            return 0
        if len(key) != value.numel():
            raise ValueError(f"key has {len(key)} tokens but value has {value.numel()} slots")
        n_aligned = self._aligned(len(key))
        value = value.reshape(-1)[:n_aligned].to(torch.int64)
        path = self._walk(key[:n_aligned])
        matched = self._on_path(path, value)
        covered = sum(len(n.key) for n in path)
        if covered < n_aligned:
            leaf = self._new_child(path[-1] if path else self.root_node, key[covered:n_aligned])
            self._on_new_leaf(leaf, value[covered:].clone())
        return matched

    def _new_child(self, parent: TreeNode, key: Sequence[int]) -> TreeNode:
        """A new node for `key` under `parent` (no child of it starts with key's first page), its
        tiers still to be set."""
        child = TreeNode(next(self._node_ids), tuple(key), None, parent)
        child.last_access = self._now
        parent.children[self._child_key(child.key)] = child
        return child

    def _on_path(self, path: list[TreeNode], value: torch.Tensor) -> int:
        """`insert`'s already-cached part: its length (the caller frees its own slots there)."""
        return sum(len(n.key) for n in path)

    def _on_new_leaf(self, leaf: TreeNode, value: torch.Tensor) -> None:
        leaf.value = value
        self._evictable += len(leaf.key)

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect the path node..root from eviction."""
        while node is not self.root_node:
            if node.lock_ref == 0:
                self._evictable -= self._node_len(node)
                self._protected += self._node_len(node)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref(node)`."""
        while node is not self.root_node:
            if node.lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref on unlocked node {node}")
            if node.lock_ref == 1:
                self._evictable += self._node_len(node)
                self._protected -= self._node_len(node)
            node.lock_ref -= 1
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_tokens: int) -> int:
        """Free LRU unlocked leaves until >= num_tokens freed or nothing is evictable."""
        if self.disable or num_tokens <= 0:
            return 0
        return self._evict_lru(lambda n: n.is_leaf() and n.lock_ref == 0, self._remove_leaf, num_tokens)

    def _remove_leaf(self, node: TreeNode) -> int:
        self.allocator.free(node.value)
        del node.parent.children[self._child_key(node.key)]
        self._evictable -= len(node.key)
        return len(node.key)

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        """Tokens stored in the tree (recounted; equals evictable + protected)."""
        return sum(len(n.key) for n in self._all_nodes())

    def _all_nodes(self) -> list[TreeNode]:
        out, stack = [], [self.root_node]
        while stack:
            node = stack.pop()
            if node is not self.root_node:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def pretty_print(self) -> str:
        """Render the tree (one node per line) and print it; returns the text."""
        lines: list[str] = []

        def walk(node: TreeNode, depth: int) -> None:
            for child in node.children.values():
                head = list(child.key[:10])
                more = "..." if len(child.key) > 10 else ""
                lines.append(f"{'  ' * depth}{head}{more} len={len(child.key)} lock={child.lock_ref}")
                walk(child, depth + 1)

        walk(self.root_node, 0)
        lines.append(f"total={self.total_size()} evictable={self._evictable} protected={self._protected}")
        text = "\n".join(lines)
        print(text)
        return text
