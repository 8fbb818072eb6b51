"""HiCache under pipeline parallelism (`--pp-size > 1`): stage 0 decides, later stages follow.

Only stage 0 holds the radix tree and the allocators (docs/pp-cp.md); every stage holds its own
layers' KV, so every stage needs the same tier copies for its layers. Stage 0's `HiRadixCache`
records each copy it makes as a `TierOp` (slots only, no bytes); the ring carries them to the later
stages ahead of the next micro-batch, and each stage's `StageTiers` replays them on its own KV pool,
host pool and storage namespace. Replaying in stage 0's order, before any micro-batch launched
after them, gives every stage the same tier contents as stage 0 (a micro-batch's slots are written
on stage k after every earlier op and micro-batch, as on stage 0).

L3 loads need agreement: a page readable on stage 0 may be missing or corrupt on another stage.
Before loading, stage 0 sends a `StorageQuery` down the ring; each stage counts how many of the
pages it can read (checksummed, its own namespace), keeps their payloads staged under the query id,
and passes on the minimum (over its tp ranks too); the last stage answers stage 0. Stage 0 loads that
many pages and records a `LoadPages` op (n = 0: release), with which each stage writes its staged
payloads to the same slots. A prefix readable on every stage is skipped by the whole pipeline; one
readable on some stages only is recomputed by all (stage 0 counts the pages it lost that way, and
the read failures the other stages met while answering).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from sglang.srt.mem_cache.hicache.page_store import PageStore, write_missing
from sglang.srt.mem_cache.hicache.host_pool import HostKVPool

logger = logging.getLogger(__name__)


@dataclass
class Backup:
    """Copy device slots -> host slots (L1 -> L2)."""

    device: list[int]
    host: list[int]


@dataclass
class Restore:
    """Copy host slots -> device slots (L2 -> L1)."""

    host: list[int]
    device: list[int]


@dataclass
class StorePages:
    """Write pages [first, end) of `tokens` (rows: `slots`, one per token) that the stage lacks."""

    tokens: list[int]
    first: int
    end: int
    slots: list[int]


@dataclass
class LoadPages:
    """Write the first `n` staged pages of query `query_id` to `slots` (the first page's first
    `skip` rows are already in L1); drop the query's staged pages."""

    query_id: int
    n: int
    skip: int
    slots: list[int]


@dataclass
class ClearStorage:
    """Delete the stage's storage pages (`/clear_hicache_storage_backend`)."""


TierOp = Union[Backup, Restore, StorePages, LoadPages, ClearStorage]


@dataclass
class StorageQuery:
    """How many storage pages of `tokens`, from page `p0` on, every stage can read (at most `count`)."""

    query_id: int
    tokens: list[int]
    p0: int
    count: int
    peer_read_failures: int = 0  # bad pages the later stages met while answering


# Stage 0's way to ask the ring: (query, ops recorded so far, sent ahead of it) -> the answer.
AskRing = Callable[[StorageQuery, list], StorageQuery]


def _ids(t: list[int]) -> torch.Tensor:
    return torch.tensor(t, dtype=torch.int64)


class StageTiers:
    """A later stage's tiers: its host pool and storage namespace, driven by stage 0's ops.
    `agree`: the minimum of a count over the stage's tp ranks (None at tp 1)."""

    def __init__(
        self,
        host: HostKVPool,
        storage: Optional[PageStore],
        agree: Optional[Callable[[int], int]] = None,
    ):
        self.host = host
        self.storage = storage
        self.agree = agree
        self.staged: dict[int, list[bytes]] = {}

    def apply(self, ops: list[TierOp]) -> None:
        for op in ops:
            if isinstance(op, Backup):
                self.host.backup(_ids(op.device), _ids(op.host))
            elif isinstance(op, Restore):
                self.host.restore(_ids(op.host), _ids(op.device))
            elif isinstance(op, StorePages):
                self._store(op)
            elif isinstance(op, ClearStorage):
                if self.storage is not None:
                    self.storage.clear()
            else:
                self._load(op)

    def _store(self, op: StorePages) -> None:
        if self.storage is None:
            return
        sp, slots = self.storage.page_size, _ids(op.slots)
        names = self.storage.page_hashes(op.tokens, op.end)
        present = self.storage.exists_many(names[op.first : op.end])
        first, pack = op.first, self.host.pack
        write_missing(
            self.storage,
            names[first : op.end],
            present,
            lambda i: pack(slots[(first + i) * sp : (first + i + 1) * sp]),
        )

    def _load(self, op: LoadPages) -> None:
        pages = self.staged.pop(op.query_id, [])
        assert len(pages) >= op.n, (len(pages), op.n)
        sp, slots = self.storage.page_size, _ids(op.slots)
        for i in range(op.n):
            dst = slots[max(0, i * sp - op.skip) : (i + 1) * sp - op.skip]
            self.host.unpack(dst, pages[i], op.skip if i == 0 else 0)

    def answer(self, q: StorageQuery) -> StorageQuery:
        """Count (and stage) the pages of the query this stage can read; the running minimum."""
        pages: list[bytes] = []
        failures = 0
        if self.storage is not None:
            before = self.storage.stats.read_failures
            want = self.host.page_bytes(self.storage.page_size)
            names = self.storage.page_hashes(q.tokens, q.p0 + q.count)
            for data in self.storage.get_run(names[q.p0 :]):
                if len(data) != want:  # another page size under the name
                    self.storage.stats.add("read_failures")
                    break
                pages.append(data)
            failures = self.storage.stats.read_failures - before
        n = len(pages) if self.agree is None else self.agree(len(pages))
        self.staged[q.query_id] = pages[:n]
        return StorageQuery(q.query_id, q.tokens, q.p0, min(q.count, n), q.peer_read_failures + failures)


class RingPeers:
    """Stage 0's side: numbers the queries and asks the ring (`ask`, built by managers/pp)."""

    def __init__(self, ask: AskRing):
        self.ask = ask
        self.next_id = 0

    def readable(self, tokens: list[int], p0: int, count: int, ops: list) -> StorageQuery:
        self.next_id += 1
        return self.ask(StorageQuery(self.next_id, list(tokens), p0, count), ops)
