"""HiCache under pipeline parallelism (`--pp-size > 1`): stage 0 decides, later stages follow.

Only stage 0 holds the radix tree and the allocators (docs/pp-cp.md); every stage holds its own
layers' KV, so every stage needs the same tier copies for its layers. Stage 0's `HiRadixCache`
records each copy it makes as a `TierOp` (slots only, no bytes); the ring carries them to the later
stages ahead of the next micro-batch, and each stage's `StageTiers` replays them on its own KV pool,
host pool and storage namespace. Replaying in stage 0's order, before any micro-batch launched
after them, gives every stage the same tier contents as stage 0 (a micro-batch's slots are written
on stage k after every earlier op and micro-batch, as on stage 0).

L3 reads are the storage prefetch's (prefetch.py), on every stage: when stage 0 starts a waiting
request's prefetch into host rows it has reserved, it also sends a `StorageQuery` down the ring
(after the ops recorded so far) naming those pages and rows, and goes on scheduling. Each later
stage reads the pages of its own namespace into the same host rows of its host pool on its I/O
thread (`StageTiers.read`), lowers the query's count to the pages it read (the minimum over its tp
ranks too) and passes it on; the last stage answers stage 0 (`Ring`). Stage 0 lands the pages every
stage read (the minimum of its own ranks' reads and the answer) as an L2 node: the later stages'
host rows already hold their layers' part of them, and admission restores them like any L2 hit.
So a prefix readable on every stage is skipped by the whole pipeline, one readable on some stages
only is recomputed by all (stage 0 counts the pages it lost that way, and the read failures the
other stages met). The host rows of a query are its own until the answer is back: stage 0 lands
or frees them only then, so no later op can reach them while a later stage may still write them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable, Optional, Protocol, Union

import torch

from sglang.srt.mem_cache.hicache.host_pool import HostKVPool
from sglang.srt.mem_cache.hicache.page_store import PageStore, write_missing
from sglang.srt.mem_cache.hicache.prefetch_reader import PageReader, PrefetchTask

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
class ClearStorage:
    """Delete the stage's storage pages (`/clear_hicache_storage_backend`)."""


TierOp = Union[Backup, Restore, StorePages, ClearStorage]


@dataclass
class StorageQuery:
    """Read storage pages [p0, p0 + count) of `tokens` into host rows `host_slots` (the first
    page's first `skip` rows excluded); on the way back `count` is what every stage read."""

    query_id: int
    tokens: list[int]
    p0: int
    count: int
    host_slots: list[int]
    skip: int = 0
    peer_read_failures: int = 0  # bad pages the later stages met while reading


class Ring(Protocol):
    """Stage 0's way to the later stages (managers/pp/hicache_ring.py). `answers` is called by every
    rank of stage 0 at the same step: each gets the same list."""

    def send(self, query: StorageQuery, ops: list) -> None:
        """Send the ops recorded so far, then the query (non-blocking for the answer)."""

    def answers(self) -> list[StorageQuery]:
        """The answers that came back since the last call."""


def _ids(t: list[int]) -> torch.Tensor:
    return torch.tensor(t, dtype=torch.int64)


class StageTiers:
    """A later stage's tiers: its host pool and storage namespace, driven by stage 0's ops and
    queries. `agree`: the minimum of a count over the stage's tp ranks (None at tp 1), called on
    the I/O thread (a group of its own: the stage's main thread keeps its collectives)."""

    def __init__(
        self,
        host: HostKVPool,
        storage: Optional[PageStore],
        agree: Optional[Callable[[int], int]] = None,
    ):
        self.host = host
        self.storage = storage
        self.agree = agree
        self.reader = PageReader(storage, host) if storage is not None else None

    def apply(self, ops: list[TierOp]) -> None:
        for op in ops:
            if isinstance(op, Backup):
                self.host.backup(_ids(op.device), _ids(op.host))
            elif isinstance(op, Restore):
                self.host.restore(_ids(op.host), _ids(op.device))
            elif isinstance(op, StorePages):
                self._store(op)
            elif self.storage is not None:  # ClearStorage
                self.storage.clear()

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

    def read(self, q: StorageQuery, done: Callable[[StorageQuery], None]) -> None:
        """Read the query's pages into its host rows on the I/O thread; `done(answer)` is called
        there (at once, here, without a storage backend): the query with its count lowered to the
        pages this stage read, agreed over its tp ranks."""
        if self.reader is None:
            done(self._answer(q, None))
        else:
            self.reader.submit(self._task(q), then=lambda t: done(self._answer(q, t)))

    def _task(self, q: StorageQuery) -> PrefetchTask:
        names = self.storage.page_hashes(q.tokens, q.p0 + q.count)[q.p0 :]
        return PrefetchTask(f"query-{q.query_id}", q.tokens, 0, names, q.skip, _ids(q.host_slots), None)

    def _answer(self, q: StorageQuery, task: Optional[PrefetchTask]) -> StorageQuery:
        n = 0 if task is None else task.done
        n = n if self.agree is None else self.agree(n)
        failed = int(task is not None and task.failed)
        return replace(q, count=min(q.count, n), peer_read_failures=q.peer_read_failures + failed)


class RingPeers:
    """Stage 0's side: numbers the queries it sends down the `Ring`."""

    def __init__(self, ring: Ring):
        self.ring = ring
        self.next_id = 0

    def send(
        self, tokens: list[int], p0: int, count: int, host_slots: list[int], skip: int, ops: list
    ) -> int:
        """Ask the later stages to read `count` pages from page `p0` into `host_slots`; the query id."""
        self.next_id += 1
        self.ring.send(StorageQuery(self.next_id, list(tokens), p0, count, list(host_slots), skip), ops)
        return self.next_id

    def answers(self) -> list[StorageQuery]:
        return self.ring.answers()
