"""HiCache on the pipeline ring (mem_cache/hicache/pipeline.py): stage 0's tier copies and L3
page reads travel the ring in order with the micro-batches.

- `MsgType.TIERS` (stage k -> k+1): a list of `TierOp`s stage 0 recorded; stage 0 sends them ahead
  of its next micro-batch (or when the ring is idle); each stage replays them, then passes them on.
- `MsgType.QUERY` (stage k -> k+1): a `StorageQuery` stage 0 sends when a storage prefetch starts.
  Each stage hands it to its I/O thread, which reads the pages into the query's host rows and
  agrees with the stage's other tp ranks (a gloo group of its own, `io_agree`), then puts a local
  `READ` in the stage's inbox; the stage loop takes it in turn and passes the lowered query on (the
  last stage's first rank answers stage 0's entry rank: `ANSWER`). Micro-batches and TIERS go on
  meanwhile: the query's rows are its own until stage 0 has the answer.
- Stage 0's `RingQueries`: sends the queries, and at each prefetch poll the entry rank takes the
  answers that came back and shares them with the other ranks of stage 0.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

from sglang.srt.distributed.group_coordinator import GroupCoordinator
from sglang.srt.distributed.p2p import Message
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.distributed.pp_comm import PPComm
from sglang.srt.managers.pp.messages import MsgType
from sglang.srt.mem_cache.hicache.pipeline import StageTiers, StorageQuery

logger = logging.getLogger(__name__)


def send_tier_ops(comm: PPComm, ops: list) -> None:
    """Stage 0: send recorded tier copies down the ring (before anything that depends on them)."""
    if ops:
        comm.send_next(MsgType.TIERS, -1, ops).wait()


class RingQueries:
    """Stage 0's `Ring` (pipeline.py): every rank of stage 0 sends its query to its next-stage
    peer; the answers reach the entry rank, which shares them at each `answers()` call."""

    def __init__(self, comm: PPComm, groups: ParallelGroups):
        self.comm, self.groups = comm, groups

    def send(self, query: StorageQuery, ops: list) -> None:
        send_tier_ops(self.comm, ops)
        self.comm.send_next(MsgType.QUERY, -1, query).wait()

    def answers(self) -> list[StorageQuery]:
        got = None
        if self.comm.receives_outputs:
            got = [m.obj for m in self.comm.inbox.take_all(MsgType.ANSWER)]
        if self.groups.replica.size > 1:
            got = self.groups.replica.broadcast_object(got, src=0)
        return got


def io_agree(args: Any, groups: ParallelGroups) -> Optional[Callable[[int], int]]:
    """The minimum of a count over this rank's stage replica, for the later stages' storage I/O
    threads: a gloo group per replica of its own (the stage's main thread keeps its groups).
    Collective: every world rank calls it, in the same order; None without an L3 backend or at
    one rank per replica."""
    if not args.enable_hierarchical_cache or args.hicache_storage_backend == "none":
        return None
    mine = None
    for ranks in groups.layout.all_replica_groups():
        if len(ranks) > 1:
            group = dist.new_group(ranks, backend="gloo")
            if groups.world_rank in ranks:
                mine = (ranks, group)
    if mine is None:
        return None
    ranks, group = mine
    coord = GroupCoordinator(
        "hicache-io", ranks, ranks.index(groups.world_rank), group, group, torch.device("cpu")
    )
    return lambda n: min(v[0] for v in coord.all_gather_ints([n]))


class Terminated(SystemExit):
    """SIGTERM on a later stage, raised where it cannot cut a TIERS replay short."""


class StageHiCache:
    """A later stage's end: replays TIERS, answers QUERY, passes both on.

    A server's processes are stopped by SIGTERM, not by STOP round the ring. Stage 0 sends a
    finished request's tier copies before its answer, so when the client has the answer and stops
    the server, this stage may still hold them unreplayed (its L3 pages then missing after a
    restart). `sigterm_drains()` makes SIGTERM end the stage only between messages, after it
    replayed every TIERS already received, and any that arrive within `drain_grace_s` of the last
    (stage 0 waits for its TIERS send before it answers, but the receiver thread here may still be
    reading that message when the SIGTERM lands)."""

    drain_grace_s = 0.5

    KINDS = (MsgType.TIERS, MsgType.QUERY, MsgType.READ)

    def __init__(self, tiers: StageTiers, comm: PPComm, is_last: bool):
        self.tiers = tiers
        self.comm = comm
        self.is_last = is_last
        self._busy = False  # replaying TIERS: a SIGTERM now waits for the end of it
        self._term = False

    def handle(self, msg: Message) -> None:
        if msg.kind == MsgType.TIERS:
            self._busy = True
            try:
                self._replay(msg)
            finally:
                self._busy = False
            if self._term:
                raise Terminated(0)
        elif msg.kind == MsgType.QUERY:  # read on the I/O thread; READ comes back in the inbox
            inbox, mb_id = self.comm.inbox, msg.mb_id
            self.tiers.read(msg.obj, lambda answer: inbox.put(Message(MsgType.READ, mb_id, answer)))
        elif not self.is_last:
            self.comm.send_next(MsgType.QUERY, msg.mb_id, msg.obj).wait()
        else:
            sent = self.comm.send_return(MsgType.ANSWER, msg.mb_id, msg.obj)
            if sent is not None:
                sent.wait()

    def _replay(self, msg: Message) -> None:
        self.tiers.apply(msg.obj)
        if not self.is_last:
            self.comm.send_next(MsgType.TIERS, msg.mb_id, msg.obj).wait()

    @contextlib.contextmanager
    def sigterm_drains(self) -> Iterator[None]:
        """Within: SIGTERM replays the TIERS this stage has received, then exits (status 0). Only
        in the main thread (a test's thread-run stage keeps the default)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_term(signum, frame) -> None:
            self._term = True
            if not self._busy:
                raise Terminated(0)

        previous = signal.signal(signal.SIGTERM, on_term)
        try:
            yield
        except Terminated:
            self._drain()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _drain(self) -> None:
        """Replay what is queued and what arrives within `drain_grace_s` of the last one; a peer
        already gone ends the wait (and the pass-on), not the replay of what came."""
        self._busy = True  # a second SIGTERM must not cut this short
        while (msg := self._next_tiers()) is not None:
            self.tiers.apply(msg.obj)
            if self.is_last:
                continue
            try:
                self.comm.send_next(MsgType.TIERS, msg.mb_id, msg.obj).wait()
            except Exception as err:  # noqa: BLE001 - on the way out: this stage's writes are done
                logger.warning("pipeline stage: tier copies not passed on at shutdown (%s)", err)

    def _next_tiers(self) -> Optional[Message]:
        try:
            return self.comm.inbox.take(MsgType.TIERS, timeout=self.drain_grace_s)
        except RuntimeError:  # the link failed (stage 0 gone): nothing more will come
            return None
