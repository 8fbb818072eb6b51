"""HiCache storage prefetch: a waiting request's L3 pages read into the host tier (L2) off the
scheduler thread (`--hicache-storage-prefetch-policy`).

When a request waits and its prompt continues past its L1/L2 match into storage pages, the
scheduler thread hashes and probes them a few at a time (`exists_many`, the steps doubling) up to
the first one the backend lacks, allocates host rows for that stored run (capped by the rows the
host tier has, L2 evicted for them), locks the matched path and queues a `PrefetchTask`; `PageReader`, one I/O thread per rank with a bounded queue, reads the pages in
order (backend read + checksum) and unpacks each into its host rows, stopping at the first miss,
failure or cancel. Everything that touches the tree or the allocators stays on the scheduler thread
(`StoragePrefetch`): a finished task, or one cut short at admission, *lands* its read pages in the
tree as an L2-only node (the rows beyond them are freed once the thread is done with the task), and
admission then loads them into the KV pool like any L2 hit. The policy says when a waiting
request may be admitted: `best_effort` at once (what has landed is used, the rest is computed),
`wait_complete` once its prefetch ended, `timeout` once it ended or after upstream's bound
(`prefetch_timeout_base` + `prefetch_timeout_per_ki_token` x tokens / 1024 seconds, extra config
keys). A failed read (checksum, backend down) ends the task early and is counted; the request
recomputes what was not read. Cancelled tasks (abort, flush) free their rows when the thread has
let go of them; `drain` waits for that (flush), `close` stops the thread.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

logger = logging.getLogger(__name__)

POLICIES = ("best_effort", "wait_complete", "timeout")
PROBE_FIRST_PAGES = 4  # pages hashed and probed (`exists_many`) before a prefetch's first step
PROBE_MAX_PAGES = 64  # ... at most per later step (or the backend's batch, when larger)


@dataclass(frozen=True)
class PrefetchConfig:
    policy: str = "timeout"
    timeout_base: float = 1.0  # seconds (upstream's prefetch_timeout_base)
    timeout_per_ki_token: float = 0.25  # seconds per 1024 tokens to fetch (prefetch_timeout_per_ki_token)
    queue_size: int = 64  # tasks queued for the I/O thread at most

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"--hicache-storage-prefetch-policy {self.policy!r} is not one of {POLICIES}")

    @classmethod
    def from_extra(cls, policy: str, extra: dict) -> "PrefetchConfig":
        base, per_ki = (
            extra.get("prefetch_timeout_base", 1.0),
            extra.get("prefetch_timeout_per_ki_token", 0.25),
        )
        for key, v in (("prefetch_timeout_base", base), ("prefetch_timeout_per_ki_token", per_ki)):
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(
                    f"--hicache-storage-backend-extra-config {key} must be a number >= 0, got {v!r}"
                )
        return cls(policy, float(base), float(per_ki))


@dataclass
class PrefetchStats:
    prefetch_started: int = 0  # tasks queued
    prefetch_pages: int = 0  # storage pages read into the host tier
    prefetch_hit_tokens: int = 0  # admitted prefix tokens that came from a prefetch
    prefetch_wait_seconds: float = 0.0  # time requests were held back waiting for their prefetch
    prefetch_failures: int = 0  # prefetches cut short by a bad page or an unreachable backend
    prefetch_no_room: int = 0  # prefetches not started: no host-tier room


@dataclass(eq=False)
class PrefetchTask:
    """Pages [p0, p0 + len(names)) of `key` into `host_slots` (tokens key[start:end]; the first
    page's first `skip` rows are already cached). The thread writes `done`, `failed`, `finished`."""

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
    landed: Optional[int] = None  # end token of the pages handed to the tree (None: not yet)
    land_start: int = 0  # first token the landed node holds (what the tree lacked)
    blocked_since: Optional[float] = None

    @property
    def end(self) -> int:
        return len(self.key)


class PageReader:
    """The rank's storage I/O thread (started at the first task)."""

    def __init__(self, storage: Any, host: Any, queue_size: int):
        self.storage, self.host = storage, host
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.thread: Optional[threading.Thread] = None

    def submit(self, task: PrefetchTask) -> bool:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="hicache-prefetch", daemon=True)
            self.thread.start()
        try:
            self.queue.put_nowait(task)
        except queue.Full:
            return False
        return True

    def close(self) -> None:
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
            self.thread = None

    def _run(self) -> None:
        while True:
            task = self.queue.get()
            if task is None:
                return
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


class StoragePrefetch:
    """The scheduler thread's side: tasks per request id, landing, the admission policy."""

    def __init__(self, tree: Any, config: PrefetchConfig):
        self.tree, self.config = tree, config
        self.reader = PageReader(tree.storage, tree.host, config.queue_size)
        self.tasks: dict[str, Optional[PrefetchTask]] = {}  # None: nothing to fetch for that request
        self.leftovers: list[PrefetchTask] = []  # ended tasks whose rows wait for the thread
        self.stats = PrefetchStats()

    def wants(self, rid: str) -> bool:
        return rid not in self.tasks

    def start(self, rid: str, key: Sequence[int]) -> bool:
        """Queue the prefetch of the storage pages continuing `key`'s L1/L2 match; False when the
        queue is full (tried again at the next step). Only the leading pages the backend holds
        are taken (probed a few at a time), as many as the host tier has rows for."""
        tree, sp = self.tree, self.tree.storage.page_size
        path = tree._walk(key)
        start = sum(len(n.key) for n in path)
        total, p0 = len(key) // sp, start // sp
        skip = start - p0 * sp
        before = self.reader.failures()
        # probed before host rows are taken (and L2 evicted for them): what is not stored, or
        # past what the host tier could ever hold, takes no rows
        names = self._stored_run(key, p0, min(total, p0 + (tree.host.size + skip) // sp))
        last = path[-1] if path else tree.root_node
        if names:
            tree.inc_lock_ref(last)  # before evicting L2 for the rows: the matched path stays
            slots = self._reserve(len(names), skip)
            if slots is None:
                tree.dec_lock_ref(last)
                self.stats.prefetch_no_room += 1
        if not names or slots is None:
            self.stats.prefetch_failures += int(self.reader.failures() > before)  # backend down
            self.tasks[rid] = None
            return True
        names = names[: (slots.numel() + skip) // sp]
        task = PrefetchTask(rid, list(key[: (p0 + len(names)) * sp]), start, names, skip, slots, last)
        if not self.reader.submit(task):
            tree.dec_lock_ref(last)
            tree.host.free(slots)
            return False
        self.tasks[rid] = task
        self.stats.prefetch_started += 1
        return True

    def _stored_run(self, key: Sequence[int], p0: int, end: int) -> list[str]:
        """Names of the pages p0, p0 + 1, ... of `key` (before page `end`) that the backend holds,
        up to the first it lacks: hashed and probed (`exists_many`) a few pages at a time, the
        steps doubling, so a long prompt with a short stored prefix costs about that prefix."""
        storage = self.tree.storage
        hashes = itertools.islice(storage.iter_page_hashes(key, end), p0, None)
        out: list[str] = []
        step = PROBE_FIRST_PAGES
        while len(out) < end - p0:
            chunk = list(itertools.islice(hashes, step))
            present = storage.exists_many(chunk)
            held = present.index(False) if False in present else len(chunk)
            out += chunk[:held]
            if held < len(chunk):
                break
            step = min(2 * step, max(PROBE_MAX_PAGES, storage.batch_pages))
        return out

    def _reserve(self, pages: int, skip: int) -> Optional[torch.Tensor]:
        """Host rows for `pages` storage pages (the first's first `skip` rows excluded), L2 evicted
        for them; as many whole pages as there is room for when the tier is short (None: none)."""
        host, sp = self.tree.host, self.tree.storage.page_size
        need = pages * sp - skip
        if need > host.available_size():
            self.tree._evict_host(need - host.available_size())
        fit = min(pages, (host.available_size() + skip) // sp)
        return host.alloc(fit * sp - skip) if fit > 0 else None

    def poll(self) -> None:
        """Land the finished tasks; free the rows of ended tasks the thread has let go of."""
        for task in self.tasks.values():
            if task is not None and task.landed is None and task.finished.is_set():
                self._land(task)
        self._free_leftovers()

    def _free_leftovers(self) -> None:
        keep = []
        for task in self.leftovers:
            if task.finished.is_set():
                used = 0 if task.landed is None else task.landed - task.start
                if used < task.host_slots.numel():
                    self.tree.host.free(task.host_slots[used:])
            else:
                keep.append(task)
        self.leftovers = keep

    def _land(self, task: PrefetchTask, key: Optional[Sequence[int]] = None) -> Optional[list]:
        """Hand the pages read so far to the tree (an L2-only node, locked for the request).
        `key`: the request's whole match key (at admission): the tree is walked along it, and
        that walk (ending with the landed node) is returned for the admission to use."""
        if not task.finished.is_set():
            task.cancel = True
        n, sp = task.done, self.tree.storage.page_size
        end = task.start - task.skip + n * sp  # pages [p0, p0 + n): p0 * sp = start - skip
        self.stats.prefetch_pages += n
        self.stats.prefetch_failures += int(task.failed)
        task.landed, task.land_start = task.start, task.start
        path = None
        if end > task.start:
            path = self._adopt(task, task.key[:end] if key is None else key, end)
            task.landed = end
            node = path[-1]
            self.tree.inc_lock_ref(node)
            self.tree.dec_lock_ref(task.node)
            task.node = node
        self.leftovers.append(task)  # the rows past `landed`, once the thread is done
        self._free_leftovers()
        return path

    def _adopt(self, task: PrefetchTask, key: Sequence[int], end: int) -> list:
        """The rows of key[task.start:end] (the path to key[:start] is locked) become an L2-only
        leaf after what the tree holds of `key` now; rows it already holds are freed. Returns
        `key`'s walk (with that leaf) and sets where the leaf starts (`land_start`)."""
        tree = self.tree
        path = tree._walk(key)
        covered = sum(len(n.key) for n in path)
        assert covered >= task.start, (covered, task.start)
        rows = task.host_slots[: end - task.start]
        if covered > task.start:
            tree.host.free(rows[: covered - task.start])
        task.land_start = covered
        if covered < end:
            leaf = tree._new_child(path[-1] if path else tree.root_node, key[covered:end])
            leaf.value, leaf.host_value = None, rows[covered - task.start :].clone()
            path.append(leaf)
        return path

    def ready(self, rid: str) -> bool:
        """Whether admission may take the request now (the policy)."""
        task = self.tasks.get(rid)
        if rid not in self.tasks:  # not started yet (queue full): only best_effort goes on
            return self.config.policy == "best_effort"
        if task is None or task.landed is not None or task.finished.is_set():
            return True
        policy, now = self.config.policy, time.monotonic()
        ok = policy == "best_effort" or (
            policy == "timeout" and now - task.t0 >= self._timeout(task.end - task.start)
        )
        if not ok and task.blocked_since is None:
            task.blocked_since = now
        return ok

    def _timeout(self, tokens: int) -> float:
        return self.config.timeout_base + self.config.timeout_per_ki_token * tokens / 1024

    def take(self, rid: str, key: Sequence[int]) -> tuple[Optional[PrefetchTask], Optional[list]]:
        """Admission (`key`: the request's match key): the request's task with its pages landed
        (cut short if still reading), and `key`'s walk when landing made one (else None)."""
        task = self.tasks.pop(rid, None)
        if task is None:
            return None, None
        path = self._land(task, key) if task.landed is None else None
        if task.blocked_since is not None:
            self.stats.prefetch_wait_seconds += time.monotonic() - task.blocked_since
        return task, path

    def release(self, task: Optional[PrefetchTask]) -> None:
        """Unlock what the task held for its request (after admission, or on abort)."""
        if task is not None:
            self.tree.dec_lock_ref(task.node)

    def end(self, rid: str) -> None:
        """The request left the queue without admission (abort): cancel, unlock, free."""
        task = self.tasks.pop(rid, None)
        if task is None:
            return
        task.cancel = True
        if task.landed is None:
            task.landed = task.start  # nothing handed to the tree: every row is freed
            self.leftovers.append(task)
        self.release(task)
        self._free_leftovers()

    def waiting_only(self, rids: Sequence[str]) -> bool:
        """Whether every request of `rids` waits on an unfinished prefetch (nothing else to do)."""
        return bool(rids) and all(not self.ready(r) for r in rids)

    def wait(self, seconds: float) -> None:
        """Sleep until a running prefetch ends, at most `seconds` (an idle scheduler)."""
        for task in self.tasks.values():
            if task is not None and not task.finished.is_set():
                task.finished.wait(seconds)
                return

    def drain(self) -> None:
        """Cancel every task and wait for the thread to let go of their rows (flush)."""
        for rid in list(self.tasks):
            self.end(rid)
        for task in self.leftovers:
            task.finished.wait()
        self._free_leftovers()

    def close(self) -> None:
        self.drain()
        self.reader.close()
