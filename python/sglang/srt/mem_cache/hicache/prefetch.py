"""HiCache storage prefetch: a waiting request's L3 pages read into the host tier (L2) off the
scheduler thread (`--hicache-storage-prefetch-policy`).

When a request waits and its prompt continues past its L1/L2 match into storage pages, the
scheduler thread hashes and probes them a few at a time (`exists_many`, the steps doubling) up to
the first one the backend lacks, allocates host rows for that stored run (capped by the rows the
host tier has, L2 evicted for them), locks the matched path and queues a `PrefetchTask`;
`PageReader` (prefetch_reader.py), one I/O thread per rank, reads the pages in order (backend read
+ checksum) and unpacks each into its host rows, stopping at the first miss, failure or cancel.
Everything that touches the tree or the allocators stays on the scheduler thread
(`StoragePrefetch`): a finished task, or one cut short at admission, *lands* its read pages in the
tree as an L2-only node (the rows beyond them are freed once the thread is done with the task), and
admission then loads them into the KV pool like any L2 hit. The policy says when a waiting
request may be admitted: `best_effort` at once (what has landed is used, the rest is computed),
`wait_complete` once its prefetch ended, `timeout` once it ended or after upstream's bound
(`prefetch_timeout_base` + `prefetch_timeout_per_ki_token` x tokens / 1024 seconds, extra config
keys). A failed read (checksum, backend down) ends the task early and is counted; the request
recomputes what was not read. Cancelled tasks (abort, flush) free their rows when the thread has
let go of them; `drain` waits for that (flush), `close` stops the thread.

Under tp / cp > 1 (`gather`: every rank's ints, over the replica's ranks) each rank's thread reads
its own pages (its namespace; under cp its share of each page's rows), and whatever changes
scheduling is agreed, the minimum over the group, at points where every rank's scheduler is at the
same step: how many stored pages a prefetch takes (at its start), and at each poll, per task,
whether it ended everywhere, how many pages every rank has read (what lands: pages one rank read
beyond it are dropped on every rank), whether the policy lets its request go, and which ended
tasks' rows every thread has let go of (only then are they freed). So every rank lands the same
pages at the same step, admits the same requests and keeps the same tree and host allocator; a page
missing on one rank's store only is recomputed by all. The bound on prefetches in flight counts
unlanded tasks (agreed), not the thread's queue. One rank alone runs the same code (agreeing with
itself), except that admission also takes what its thread did since the step's poll: a read that
ended makes its request ready at once, and a cut-short task lands every page read so far.

On a pipeline's stage 0 (`tree.peers`) a task also sends the later stages a query for the same
pages and host rows (pipeline.py); they read theirs on their own I/O threads while stage 0 goes on
scheduling. Until the answer is back (`peer_pages`: the pages every later stage read) the task does
not land, its request does not go (whatever the policy, but best_effort, which lands nothing then)
and its rows are not freed; it lands no more pages than the answer's count.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from sglang.srt.mem_cache.hicache.prefetch_reader import PageReader, PrefetchTask

logger = logging.getLogger(__name__)

POLICIES = ("best_effort", "wait_complete", "timeout")
PROBE_FIRST_PAGES = 4  # pages hashed and probed (`exists_many`) before a prefetch's first step
PROBE_MAX_PAGES = 64  # ... at most per later step (or the backend's batch, when larger)
ANSWER_NAP = 0.001  # seconds an idle stage 0 sleeps while only the later stages' answers are awaited
Gather = Callable[[list[int]], list[list[int]]]  # every rank's list of ints, in group order


@dataclass(frozen=True)
class PrefetchConfig:
    policy: str = "timeout"
    timeout_base: float = 1.0  # seconds (upstream's prefetch_timeout_base)
    timeout_per_ki_token: float = 0.25  # seconds per 1024 tokens to fetch (prefetch_timeout_per_ki_token)
    queue_size: int = 64  # prefetches in flight at most (more start as these land)

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
    prefetch_pages: int = 0  # storage pages landed in the host tier (the same on every rank)
    prefetch_hit_tokens: int = 0  # admitted prefix tokens that came from a prefetch
    prefetch_wait_seconds: float = 0.0  # time requests were held back waiting for their prefetch
    prefetch_failures: int = 0  # prefetches cut short by a bad page or an unreachable backend
    prefetch_no_room: int = 0  # prefetches not started: no host-tier room
    # pages each rank's I/O thread had read when its prefetches landed (>= prefetch_pages each)
    prefetch_pages_by_rank: list[int] = field(default_factory=list)


class StoragePrefetch:
    """The scheduler thread's side: tasks per request id, the group's agreement, landing, the
    admission policy. `gather`: every rank's ints (None: this rank decides alone)."""

    def __init__(self, tree: Any, config: PrefetchConfig, gather: Optional[Gather] = None):
        self.tree, self.config = tree, config
        self.gather = gather
        self.reader = PageReader(tree.storage, tree.host)
        self.tasks: dict[str, Optional[PrefetchTask]] = {}  # None: nothing to fetch for that request
        self.leftovers: list[PrefetchTask] = []  # ended tasks whose rows wait for every thread
        self.queries: dict[int, PrefetchTask] = {}  # pipeline: tasks the later stages have not answered
        self.stats = PrefetchStats()

    def _agree(self, values: list[int]) -> tuple[list[int], list[list[int]]]:
        """The element-wise minimum over the group, and every rank's values."""
        rows = [list(values)] if self.gather is None else self.gather(values)
        by_rank = self.stats.prefetch_pages_by_rank  # one entry per rank from the first agreement
        by_rank.extend([0] * (len(rows) - len(by_rank)))
        return [min(col) for col in zip(*rows)], rows

    @property
    def alone(self) -> bool:
        """No peers: this rank's view now is the agreement."""
        return self.gather is None

    def wants(self, rid: str) -> bool:
        return rid not in self.tasks

    def _in_flight(self) -> int:
        return sum(1 for t in self.tasks.values() if t is not None and t.landed is None)

    def start(self, rid: str, key: Sequence[int]) -> bool:
        """Queue the prefetch of the storage pages continuing `key`'s L1/L2 match; False when
        `queue_size` prefetches are in flight (tried again at the next step). Only the leading
        pages every rank's backend holds are taken, as many as the host tier has rows for."""
        if self._in_flight() >= self.config.queue_size:
            return False
        tree, sp = self.tree, self.tree.storage.page_size
        path = tree._walk(key)
        start = sum(len(n.key) for n in path)
        p0, skip = start // sp, start % sp
        end = min(len(key) // sp, p0 + (tree.host.size + skip) // sp)  # what the tier could hold
        before = self.reader.failures()
        names: list[str] = []
        if end > p0:  # (the same on every rank) probed before host rows are taken
            names = self._stored_run(key, p0, end)
            names = names[: self._agree([len(names)])[0][0]]
        failed = self.reader.failures() > before  # the backend was down
        last, slots = (path[-1] if path else tree.root_node), None
        if names:
            tree.inc_lock_ref(last)  # before evicting L2 for the rows: the matched path stays
            slots = self._reserve(len(names), skip)
            if slots is None:
                tree.dec_lock_ref(last)
                self.stats.prefetch_no_room += 1
        if slots is None:
            self.stats.prefetch_failures += int(failed)
            self.tasks[rid] = None
            return True
        names = names[: (slots.numel() + skip) // sp]
        task = PrefetchTask(rid, list(key[: (p0 + len(names)) * sp]), start, names, skip, slots, last)
        task.go = self.config.policy == "best_effort"
        self.reader.submit(task)
        self.tasks[rid] = task
        if tree.peers is None:
            task.peer_pages = len(names)
        else:  # the later stages read the same pages into the same rows of their host pools
            task.query_id = tree.peers.send(task.key, p0, len(names), slots.tolist(), skip, tree.take_ops())
            self.queries[task.query_id] = task
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
        """Agree on every unlanded task (ended everywhere? pages read everywhere? may its request
        go?) and on the ended tasks every thread has let go of; land the tasks ended everywhere
        and free the rows let go of everywhere. Every rank calls it at the same step. Under a
        pipeline the later stages' answers come in first: a task lands, lets its request go or
        frees its rows only once answered, and lands no more pages than every stage read."""
        if self.queries:
            self._take_answers()
        pending = [t for t in self.tasks.values() if t is not None and t.landed is None]
        if not pending and not self.leftovers:
            return
        now, local = time.monotonic(), []
        for t in pending:
            finished = t.finished.is_set()  # read before `done`: a finished task's count is final
            local += [int(finished), t.done, int(finished or self._may_go(t, now))]
        local += [int(t.finished.is_set()) for t in self.leftovers]
        agreed, rows = self._agree(local)
        for i, t in enumerate(pending):
            finished, done, go = agreed[3 * i : 3 * i + 3]
            t.done_by_rank = [r[3 * i + 1] for r in rows]
            answered = t.peer_pages is not None
            t.agreed_done = min(done, t.peer_pages) if answered else 0
            t.go = t.go or (bool(go) and answered)
            if finished and answered:
                self._land(t, everywhere=True)
        let_go, keep = agreed[3 * len(pending) :], []
        for task, gone in zip(self.leftovers, let_go):
            if gone and task.peer_pages is not None:
                self._free_unused(task)
            else:
                keep.append(task)
        self.leftovers = keep

    def _take_answers(self) -> None:
        """Pipeline: the later stages' answers (the same list on every rank of stage 0)."""
        for answer in self.tree.peers.answers():
            task = self.queries.pop(answer.query_id)
            task.peer_pages = answer.count
            self.tree.hstats.peer_missing_pages += len(task.names) - answer.count
            self.tree.hstats.peer_read_failures += answer.peer_read_failures

    def _may_go(self, task: PrefetchTask, now: float) -> bool:
        """This rank's view of whether the policy lets an unfinished prefetch's request go."""
        policy = self.config.policy
        return policy == "best_effort" or (
            policy == "timeout" and now - task.t0 >= self._timeout(task.end - task.start)
        )

    def _free_unused(self, task: PrefetchTask) -> None:
        used = 0 if task.landed is None else task.landed - task.start
        if used < task.host_slots.numel():
            self.tree.host.free(task.host_slots[used:])

    def _land(
        self, task: PrefetchTask, key: Optional[Sequence[int]] = None, everywhere: bool = False
    ) -> Optional[list]:
        """Hand the pages every rank had read at the last poll to the tree (an L2-only node, locked
        for the request). `key`: the request's whole match key (at admission): the tree is walked
        along it, and that walk (ending with the landed node) is returned for the admission to
        use. `everywhere`: every rank's thread is done with the task (its other rows freed now)."""
        if not task.finished.is_set():
            task.cancel = True
        n, sp = task.agreed_done, self.tree.storage.page_size
        end = task.start - task.skip + n * sp  # pages [p0, p0 + n): p0 * sp = start - skip
        self.stats.prefetch_pages += n
        self.stats.prefetch_failures += int(task.failed)
        for r, done in enumerate(task.done_by_rank):
            self.stats.prefetch_pages_by_rank[r] += done
        task.landed, task.land_start = task.start, task.start
        path = None
        if end > task.start:
            path = self._adopt(task, task.key[:end] if key is None else key, end)
            task.landed = end
            node = path[-1]
            self.tree.inc_lock_ref(node)
            self.tree.dec_lock_ref(task.node)
            task.node = node
        if everywhere:
            self._free_unused(task)
        else:
            self.leftovers.append(task)  # the rows past `landed`, once every thread is done
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
        """Whether admission may take the request now (the policy, as the group agreed it)."""
        if rid not in self.tasks:  # not started yet (too many in flight): only best_effort goes on
            return self.config.policy == "best_effort"
        task = self.tasks[rid]
        if task is None or task.landed is not None or task.go:
            return True
        if (
            self.alone
            and task.peer_pages is not None
            and (task.finished.is_set() or self._may_go(task, time.monotonic()))
        ):
            return True  # no peer to wait for: a read that ended since the poll counts at once
        if task.blocked_since is None:
            task.blocked_since = time.monotonic()
        return False

    def _timeout(self, tokens: int) -> float:
        return self.config.timeout_base + self.config.timeout_per_ki_token * tokens / 1024

    def take(self, rid: str, key: Sequence[int]) -> tuple[Optional[PrefetchTask], Optional[list]]:
        """Admission (`key`: the request's match key): the request's task with its pages landed
        (cut short if still reading), and `key`'s walk when landing made one (else None)."""
        task = self.tasks.pop(rid, None)
        if task is None:
            return None, None
        path = None
        if task.landed is None:
            answered = task.peer_pages is not None
            # read `finished` before `done` (final then)
            everywhere = self.alone and task.finished.is_set() and answered
            if self.alone:  # what the thread has read by now (and the later stages, answered)
                task.agreed_done = min(task.done, task.peer_pages) if answered else 0
                task.done_by_rank = [task.done]
            path = self._land(task, key, everywhere)
        if task.blocked_since is not None:
            self.stats.prefetch_wait_seconds += time.monotonic() - task.blocked_since
        return task, path

    def release(self, task: Optional[PrefetchTask]) -> None:
        """Unlock what the task held for its request (after admission, or on abort)."""
        if task is not None:
            self.tree.dec_lock_ref(task.node)

    def end(self, rid: str) -> None:
        """The request left the queue without admission (abort): cancel, unlock; its rows are
        freed once every thread has let go of them (a later poll)."""
        task = self.tasks.pop(rid, None)
        if task is None:
            return
        task.cancel = True
        if task.landed is None:
            task.landed = task.start  # nothing handed to the tree: every row is freed
            self.leftovers.append(task)
        self.release(task)

    def waiting_only(self, rids: Sequence[str]) -> bool:
        """Whether every request of `rids` waits on an unfinished prefetch (nothing else to do)."""
        return bool(rids) and all(not self.ready(r) for r in rids)

    def wait(self, seconds: float) -> None:
        """Sleep until a running prefetch ends, at most `seconds` (an idle scheduler); a moment
        when only the later stages' answers are awaited."""
        for task in self.tasks.values():
            if task is not None and not task.finished.is_set():
                task.finished.wait(seconds)
                return
        if self.queries:
            time.sleep(min(seconds, ANSWER_NAP))

    def drain(self) -> None:
        """Cancel every task and wait for the thread to let go of their rows (flush: every rank
        drains at the same step)."""
        for rid in list(self.tasks):
            self.end(rid)
        while self.queries:  # the later stages write the rows until they answer
            self._take_answers()
            if self.queries:
                time.sleep(ANSWER_NAP)
        for task in self.leftovers:
            task.finished.wait()
            self._free_unused(task)
        self.leftovers = []

    def close(self) -> None:
        """Drain and stop the thread; at shutdown no later stage's answer is awaited (their rows
        are not freed then)."""
        if self.queries:
            for rid in list(self.tasks):
                self.end(rid)
        else:
            self.drain()
        self.reader.close()
