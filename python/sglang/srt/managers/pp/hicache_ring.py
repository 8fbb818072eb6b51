"""HiCache on the pipeline ring (mem_cache/hicache/pipeline.py): stage 0's tier copies and L3
queries travel the ring in order with the micro-batches.

- `MsgType.TIERS` (stage k -> k+1): a list of `TierOp`s stage 0 recorded; stage 0 sends them ahead
  of its next micro-batch (or when the ring is idle); each stage replays them, then passes them on.
- `MsgType.QUERY` (stage k -> k+1): a `StorageQuery`; each stage lowers its count to the pages it
  can read and passes it on; the last stage's first rank answers stage 0's entry rank
  (`MsgType.ANSWER`), which shares the answer with the other ranks of stage 0.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Iterator

from sglang.srt.distributed.p2p import Message
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.distributed.pp_comm import PPComm
from sglang.srt.managers.pp.messages import MsgType
from sglang.srt.mem_cache.hicache.pipeline import AskRing, StageTiers, StorageQuery

logger = logging.getLogger(__name__)


def send_tier_ops(comm: PPComm, ops: list) -> None:
    """Stage 0: send recorded tier copies down the ring (before anything that depends on them)."""
    if ops:
        comm.send_next(MsgType.TIERS, -1, ops).wait()


def ring_ask(comm: PPComm, groups: ParallelGroups) -> AskRing:
    """Stage 0's `AskRing`: send the pending ops and the query, wait for the last stage's answer
    (every rank of stage 0 asks in lockstep; the entry rank gets the answer and broadcasts it)."""

    def ask(query: StorageQuery, ops: list) -> StorageQuery:
        send_tier_ops(comm, ops)
        comm.send_next(MsgType.QUERY, -1, query).wait()
        answer = comm.inbox.take(MsgType.ANSWER).obj if comm.receives_outputs else None
        if groups.replica.size > 1:
            answer = groups.replica.broadcast_object(answer, src=0)
        return answer

    return ask


class Terminated(SystemExit):
    """SIGTERM on a later stage, raised where it cannot cut a TIERS replay short."""


class StageHiCache:
    """A later stage's end: replays TIERS, answers QUERY, passes both on.

    A server's processes are stopped by SIGTERM, not by STOP round the ring. Stage 0 sends a
    finished request's tier copies before its answer, so when the client has the answer and stops
    the server, this stage may still hold them unreplayed (its L3 pages then missing after a
    restart). `sigterm_drains()` makes SIGTERM end the stage only between messages, after it
    replayed every TIERS already received."""

    KINDS = (MsgType.TIERS, MsgType.QUERY)

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
            return
        answer = self.tiers.answer(msg.obj)
        if not self.is_last:
            self.comm.send_next(MsgType.QUERY, msg.mb_id, answer).wait()
            return
        sent = self.comm.send_return(MsgType.ANSWER, msg.mb_id, answer)
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
        """Replay what is queued; a later peer already gone ends the pass-on, not the replay."""
        while (msg := self.comm.inbox.take(MsgType.TIERS, block=False)) is not None:
            self.tiers.apply(msg.obj)
            if self.is_last:
                continue
            try:
                self.comm.send_next(MsgType.TIERS, msg.mb_id, msg.obj).wait()
            except Exception as err:  # noqa: BLE001 - on the way out: this stage's writes are done
                logger.warning("pipeline stage: tier copies not passed on at shutdown (%s)", err)
