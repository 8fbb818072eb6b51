"""RadixCache: a radix tree over token ids whose values are KV slot indices (prefix cache).

Token-level only: it knows nothing about requests. Callers (the scheduler's cache glue):
  * `match_prefix(tokens)` -> slots of the longest cached prefix + the deepest node;
  * `inc_lock_ref(node)` while a request uses that prefix, `dec_lock_ref(node)` when done;
  * `insert(tokens, slots)` when a request's KV should be shared; it returns how many leading
    tokens were already cached, and the caller frees its own duplicate slots for that range;
  * `evict(n)` when the allocator runs low.

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
        """Split `child` so that its first `split_len` tokens become a new parent node."""
        parent = child.parent
        assert parent is not None and 0 < split_len < len(child.key)
        head = TreeNode(next(self._node_ids), child.key[:split_len], child.value[:split_len].clone(), parent)
        head.lock_ref = child.lock_ref
        head.last_access = child.last_access
        child.key = child.key[split_len:]
        child.value = child.value[split_len:].clone()
        child.parent = head
        head.children[self._child_key(child.key)] = child
        parent.children[self._child_key(head.key)] = head
        return head

    # ------------------------------------------------------------------ API
    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """Longest cached page-aligned prefix of `key`; splits a node the match ends inside."""
        empty = torch.empty(0, dtype=torch.int64)
        if self.disable:
            return MatchResult(empty, self.root_node)
        rest = tuple(key[: self._aligned(len(key))])
        node = self.root_node
        now = next(self._clock)
        node.last_access = now
        values: list[torch.Tensor] = []
        while rest:
            child = node.children.get(self._child_key(rest))
            if child is None:
                break
            child.last_access = now
            n = self._match_len(child.key, rest)
            if n < len(child.key):
                node = self._split(child, n)
                values.append(node.value)
                break
            values.append(child.value)
            node = child
            rest = rest[n:]
        indices = torch.cat(values) if values else empty
        return MatchResult(indices, node)

    def insert(self, key: Sequence[int], value: torch.Tensor) -> int:
        """Insert key -> slots (page-aligned part only); return the already-cached prefix length."""
        if self.disable:
            return 0
        if len(key) != value.numel():
            raise ValueError(f"key has {len(key)} tokens but value has {value.numel()} slots")
        n_aligned = self._aligned(len(key))
        rest = tuple(key[:n_aligned])
        value = value.reshape(-1)[:n_aligned].to(torch.int64)
        node = self.root_node
        now = next(self._clock)
        node.last_access = now
        matched = 0
        while rest:
            child = node.children.get(self._child_key(rest))
            if child is None:
                break
            child.last_access = now
            n = self._match_len(child.key, rest)
            matched += n
            rest, value = rest[n:], value[n:]
            node = self._split(child, n) if n < len(child.key) else child
        if rest:
            leaf = TreeNode(next(self._node_ids), rest, value.clone(), node)
            leaf.last_access = now
            node.children[self._child_key(rest)] = leaf
            self._evictable += len(rest)
        return matched

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect the path node..root from eviction."""
        while node is not self.root_node:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref(node)`."""
        while node is not self.root_node:
            if node.lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref on unlocked node {node}")
            if node.lock_ref == 1:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node.lock_ref -= 1
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_tokens: int) -> int:
        """Free LRU unlocked leaves until >= num_tokens freed or nothing is evictable."""
        if self.disable or num_tokens <= 0:
            return 0
        heap = [(n.last_access, n.id, n) for n in self._all_nodes() if n.is_leaf() and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            self.allocator.free(node.value)
            parent = node.parent
            assert parent is not None
            del parent.children[self._child_key(node.key)]
            freed += len(node.key)
            self._evictable -= len(node.key)
            if parent is not self.root_node and parent.is_leaf() and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

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
