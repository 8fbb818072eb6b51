"""HiCache on the pipeline ring (mem_cache/hicache/pipeline.py): stage 0's tier copies and L3
queries travel the ring in order with the micro-batches.

- `MsgType.TIERS` (stage k -> k+1): a list of `TierOp`s stage 0 recorded; stage 0 sends them ahead
  of its next micro-batch (or when the ring is idle); each stage replays them, then passes them on.
- `MsgType.QUERY` (stage k -> k+1): a `StorageQuery`; each stage lowers its count to the pages it
  can read and passes it on; the last stage's first rank answers stage 0's entry rank
  (`MsgType.ANSWER`), which shares the answer with the other ranks of stage 0.
"""

from __future__ import annotations

from sglang.srt.distributed.p2p import Message
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.distributed.pp_comm import PPComm
from sglang.srt.managers.pp.messages import MsgType
from sglang.srt.mem_cache.hicache.pipeline import AskRing, StageTiers, StorageQuery


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


class StageHiCache:
    """A later stage's end: replays TIERS, answers QUERY, passes both on."""

    KINDS = (MsgType.TIERS, MsgType.QUERY)

    def __init__(self, tiers: StageTiers, comm: PPComm, is_last: bool):
        self.tiers = tiers
        self.comm = comm
        self.is_last = is_last

    def handle(self, msg: Message) -> None:
        if msg.kind == MsgType.TIERS:
            self.tiers.apply(msg.obj)
            if not self.is_last:
                self.comm.send_next(MsgType.TIERS, msg.mb_id, msg.obj).wait()
            return
        answer = self.tiers.answer(msg.obj)
        if not self.is_last:
            self.comm.send_next(MsgType.QUERY, msg.mb_id, answer).wait()
            return
        sent = self.comm.send_return(MsgType.ANSWER, msg.mb_id, answer)
        if sent is not None:
            sent.wait()
