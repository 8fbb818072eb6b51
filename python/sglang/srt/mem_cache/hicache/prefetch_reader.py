"""The storage prefetch's I/O side (prefetch.py holds the scheduler's): a `PrefetchTask` per
waiting request, and `PageReader`, the rank's one I/O thread that reads the tasks' pages.

The thread takes tasks in order from an unbounded queue (the scheduler bounds the tasks in flight
itself: a bound every rank of a tp / cp group applies alike), reads each task's pages in batches
(`get_run`, checksummed by the backend), and unpacks each page into the task's host rows, stopping
at the first miss, failure or cancel. It writes only the task's `done` (pages unpacked, in order),
`failed` and `finished`; the rows are the task's alone until the scheduler hands them over.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class PrefetchTask:
    """Pages [p0, p0 + len(names)) of `key` into `host_slots` (tokens key[start:end]; the first
    page's first `skip` rows are already cached). The thread writes `done`, `failed`, `finished`;
    the scheduler's fields below them change only where every rank of the group agrees."""

    rid: str
    key: list[int]  # the tokens of every page to fetch (key[:end])
    start: int
    names: list[str]
    skip: int
    host_slots: torch.Tensor
    node: Any  # the locked deepest node (of the match, then of the landed pages)
    t0: float = field(default_factory=time.monotonic)
    done: int = 0
    failed: bool = False
    cancel: bool = False
    finished: threading.Event = field(default_factory=threading.Event)
    # agreed at the scheduler's polls (identical on every rank of the group):
    go: bool = False  # the policy lets the request be admitted
    agreed_done: int = 0  # pages read on every rank (what an admission now lands)
    done_by_rank: list[int] = field(default_factory=list)  # each rank's `done` at that poll
    landed: Optional[int] = None  # end token of the pages handed to the tree (None: not yet)
    query_id: Optional[int] = None  # pipeline: the later stages' read of the same pages
    peer_pages: Optional[int] = None  # pages every later stage read (None: no answer yet)
    land_start: int = 0  # first token the landed node holds (what the tree lacked)
    blocked_since: Optional[float] = None

    @property
    def end(self) -> int:
        return len(self.key)


class PageReader:
    """The rank's storage I/O thread (started at the first task)."""

    def __init__(self, storage: Any, host: Any):
        self.storage, self.host = storage, host
        self.queue: queue.Queue = queue.Queue()
        self.thread: Optional[threading.Thread] = None

    def submit(self, task: PrefetchTask, then: Optional[Callable[[PrefetchTask], None]] = None) -> None:
        """Queue the task; `then(task)`, if given, runs on the thread once the task has finished."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="hicache-prefetch", daemon=True)
            self.thread.start()
        self.queue.put_nowait((task, then))

    def close(self) -> None:
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
            self.thread = None

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            task, then = item
            self._read_one(task)
            if then is not None:
                try:
                    then(task)
                except Exception:  # noqa: BLE001 - the thread serves the next task
                    logger.exception("HiCache: after reading %s", task.rid)

    def _read_one(self, task: PrefetchTask) -> None:
        """Read one task (`finished` set at the end, whatever happened)."""
        try:
            self._read(task)
        except Exception:  # never let one task end the thread: its request recomputes
            logger.exception("HiCache prefetch of %s failed", task.rid)
            task.failed = True
        finally:
            task.finished.set()

    def failures(self) -> int:
        """The failures the calling thread has met (the other thread's do not count)."""
        return self.storage.stats.thread_failures()

    def _read(self, task: PrefetchTask) -> None:
        sp, batch = self.storage.page_size, max(1, self.storage.batch_pages)
        for at in range(0, len(task.names), batch):
            if task.cancel:
                return
            before = self.failures()
            chunk = task.names[at : at + batch]
            pages = self.storage.get_run(chunk)
            for i, page in enumerate(pages, start=at):
                rows = task.host_slots[max(0, i * sp - task.skip) : (i + 1) * sp - task.skip]
                try:
                    self.host.unpack_host(rows, page, task.skip if i == 0 else 0)
                except ValueError as e:  # a page of another size under the same name
                    logger.warning("HiCache prefetch: storage page rejected (%s); recomputing", e)
                    self.storage.stats.add("read_failures")
                    task.failed = True
                    return
                task.done = i + 1
            if len(pages) < len(chunk):
                task.failed = self.failures() > before
                return
