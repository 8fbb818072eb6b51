"""A pipeline stage after the first: receive a micro-batch, run this stage's layers, pass it on.

Later stages hold no request objects, no allocator and no radix cache: a `ModelRunner` with this
stage's layers and KV pool, and a mirror of stage 0's req_to_token table that each micro-batch
updates (`StageBatch.apply_rows`). Middle stages forward the micro-batch and their activations to
the next stage; the last stage samples and returns the token ids to stage 0 (the rank with tp
coordinate 0 sends them; every tp rank of the stage agrees on them inside `ModelRunner.sample`).
Micro-batches are processed strictly in the order stage 0 launched them.
"""

from __future__ import annotations

import logging
from typing import Optional

from sglang.srt.distributed.parallel_state import ParallelGroups, PendingSend
from sglang.srt.managers.io_struct import SchedulerReadyInfo
from sglang.srt.managers.pp_comm import PPComm
from sglang.srt.managers.pp_messages import MsgType, StageBatch, StageOutput
from sglang.srt.managers.pp_trace import PPTracer, now_s
from sglang.srt.metrics.bubble import BubbleMeter
from sglang.srt.model_executor.forward_batch import PPProxyTensors
from sglang.srt.model_executor.model_runner import ForwardResult, ModelRunner

logger = logging.getLogger(__name__)


def stage_ready_info(runner: ModelRunner) -> SchedulerReadyInfo:
    """The ready message of a rank without a scheduler (same numbers: the plan is agreed)."""
    cfg = runner.model_config
    return SchedulerReadyInfo(
        max_total_num_tokens=runner.max_total_num_tokens,
        max_req_input_len=min(cfg.context_len - 1, runner.max_total_num_tokens - 1),
        context_len=cfg.context_len,
        vocab_size=cfg.vocab_size,
        max_running_requests=runner.max_running_requests,
    )


class PendingRing:
    """Uncommitted sends by ring slot: a slot's previous sends are committed before it is reused."""

    def __init__(self, size: int, tracer: PPTracer):
        self.slots: list[list[PendingSend]] = [[] for _ in range(size)]
        self.tracer = tracer

    def commit(self, mb_id: int) -> None:
        slot = self.slots[mb_id % len(self.slots)]
        if slot:
            t0 = now_s()
            for p in slot:
                p.wait()
            slot.clear()
            self.tracer.complete("send commit", t0, now_s(), mb=mb_id)

    def add(self, mb_id: int, pending: Optional[PendingSend]) -> None:
        if pending is not None:
            self.slots[mb_id % len(self.slots)].append(pending)

    def commit_all(self) -> None:
        for slot in self.slots:
            for p in slot:
                p.wait()
            slot.clear()


class PPStageWorker:
    """The loop of a rank on pipeline stage k > 0."""

    def __init__(self, runner: ModelRunner, groups: ParallelGroups, comm: PPComm, tracer: PPTracer, ring_size: int):
        self.runner = runner
        self.groups = groups
        self.comm = comm
        self.tracer = tracer
        self.pp_rank = groups.pp.rank
        self.is_last = groups.pp.is_last
        self.pending = PendingRing(ring_size, tracer)
        self.meter = BubbleMeter()
        self.num_micro_batches = 0

    def run(self, stop=None) -> None:
        """Serve micro-batches until STOP comes down the ring (`stop` is unused: stage 0 decides)."""
        inbox = self.comm.inbox
        wanted = (MsgType.BATCH, MsgType.STOP, MsgType.PING)
        while True:
            t0 = now_s()
            msg = inbox.take(wanted, block=False)
            if msg is None:
                self.tracer.flush()  # about to block: nothing buffered is lost if we idle or die
                msg = inbox.take(wanted)
            if msg.type != MsgType.BATCH:
                self._pass_on(msg.type, msg.mb_id)
                if msg.type == MsgType.STOP:
                    self.pending.commit_all()
                    self.tracer.flush()
                    self.comm.join()
                    return
                continue
            proxy = inbox.take(MsgType.PROXY)
            if proxy.mb_id != msg.mb_id:
                raise RuntimeError(f"pipeline stage {self.pp_rank}: proxy of micro-batch {proxy.mb_id} for {msg.mb_id}")
            t1 = now_s()
            batch: StageBatch = msg.obj
            self.tracer.complete("recv wait", t0, t1, mb=batch.mb_id, pp_rank=self.pp_rank)
            wait = t1 - t0
            if batch.ring_was_empty:  # waiting for work that did not exist yet is not a bubble
                wait = min(wait, max(t1 - batch.launched_at, 0.0))
            self.meter.idle(wait)
            self._run_batch(batch, proxy.tensors)

    def _run_batch(self, batch: StageBatch, tensors: dict) -> None:
        runner = self.runner
        batch.apply_rows(runner.req_to_token_pool.req_to_token)
        wb = batch.to_worker_batch()
        t0 = now_s()
        out = runner.forward_stage(wb, PPProxyTensors(tensors))
        t1 = now_s()
        self.meter.busy(t1 - t0)
        self.tracer.complete("forward", t0, t1, **batch.trace_args(self.pp_rank))
        batch.stage_forward_s.append(t1 - t0)
        batch.stage_bubble.append(self.meter.ratio())
        self.num_micro_batches += 1
        self.pending.commit(batch.mb_id)
        if self.is_last:
            assert isinstance(out, ForwardResult)
            sent = self.comm.send_return(MsgType.OUTPUT, batch.mb_id, StageOutput.from_result(batch, out))
            self.pending.add(batch.mb_id, sent)
        else:
            assert isinstance(out, PPProxyTensors)
            self.pending.add(batch.mb_id, self.comm.send_next(MsgType.BATCH, batch.mb_id, batch))
            self.pending.add(batch.mb_id, self.comm.send_next(MsgType.PROXY, batch.mb_id, tensors=out.tensors))
        self.tracer.complete("send", t1, now_s(), mb=batch.mb_id)

    def _pass_on(self, mtype: MsgType, mb_id: int) -> None:
        """Control messages go round the ring: to the next stage, or from the last back to stage 0."""
        if self.is_last:
            sent = self.comm.send_return(mtype, mb_id)
        else:
            sent = self.comm.send_next(mtype, mb_id)
        if sent is not None:
            sent.wait()
