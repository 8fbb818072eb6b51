"""A pipeline stage after the first: receive a micro-batch, run this stage's layers, pass it on.

Later stages hold no request objects, no allocator and no radix cache: a `ModelRunner` with this
stage's layers and KV pool, and a mirror of stage 0's req_to_token table that each micro-batch
updates (`StageBatch.apply_rows`). Middle stages forward the micro-batch and their activations to
the next stage; the last stage samples and returns the token ids to stage 0 (the rank with tp
coordinate 0 sends them; every tp rank of the stage agrees on them inside `ModelRunner.sample`).
Micro-batches are processed strictly in the order stage 0 launched them. With attention DP each
replica's ranks run their replica's micro-batches (the first rank of each replica returns them);
micro-batch ids advance in lockstep over the replicas, so every stage runs micro-batch j of every
replica at the same time (an IDLE forward for a replica whose micro-batch j has no tokens).
"""

from __future__ import annotations

import logging
from typing import Optional

from sglang.srt.distributed.p2p import Message, PendingSend
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.distributed.pp_comm import PPComm
from sglang.srt.managers.io_struct import SchedulerReadyInfo
from sglang.srt.managers.pp.messages import MsgType, StageBatch, StageOutput
from sglang.srt.managers.pp.trace import PPTracer, SendProbe
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
        self.probe: Optional[SendProbe] = None  # tests: the order of forwards and send waits

    def forward_started(self, mb_id: int) -> None:
        """The loop starts micro-batch `mb_id`'s forward (for the probe)."""
        if self.probe is not None:
            self.probe.forward(mb_id)

    def _wait(self, p: PendingSend) -> None:
        if self.probe is not None:
            self.probe.waited(p)
        p.wait()

    def commit(self, mb_id: int) -> None:
        slot = self.slots[mb_id % len(self.slots)]
        if slot:
            with self.tracer.span("send commit", mb=mb_id):
                for p in slot:
                    self._wait(p)
                slot.clear()

    def add(self, mb_id: int, pending: Optional[PendingSend]) -> None:
        if pending is not None:
            if self.probe is not None:
                self.probe.issued(mb_id, pending)
            self.slots[mb_id % len(self.slots)].append(pending)

    def commit_all(self) -> None:
        for slot in self.slots:
            for p in slot:
                self._wait(p)
            slot.clear()


class PPStageWorker:
    """The loop of a rank on pipeline stage k > 0."""

    def __init__(
        self,
        runner: ModelRunner,
        groups: ParallelGroups,
        comm: PPComm,
        tracer: PPTracer,
        ring_size: int,
        pd=None,
        hicache=None,
    ):
        """`pd`: PD disaggregation's sender of this stage's KV (a prefill server), else None."""
        self.pd = pd
        self.hicache = hicache  # HiCache's tiers of this stage (hicache_ring.StageHiCache), or None
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
        """Serve micro-batches until STOP comes down the ring (`stop` is unused: stage 0 decides);
        with HiCache, a SIGTERM first replays the tier copies received (`StageHiCache`)."""
        if self.hicache is None:
            self._serve()
            return
        with self.hicache.sigterm_drains():
            self._serve()

    def _serve(self) -> None:
        while True:
            with self.tracer.span("recv wait") as wait:
                msg = self._next_message()
                if msg.kind == MsgType.BATCH:
                    proxy = self.comm.inbox.take(MsgType.PROXY)
                    if proxy.mb_id != msg.mb_id:
                        raise RuntimeError(
                            f"pipeline stage {self.pp_rank}: proxy of micro-batch {proxy.mb_id} for {msg.mb_id}"
                        )
                    wait.set(mb=msg.mb_id, pp_rank=self.pp_rank)
                else:
                    wait.drop()
            if self.hicache is not None and msg.kind in self.hicache.KINDS:
                self.hicache.handle(msg)
                continue
            if msg.kind != MsgType.BATCH:
                self._pass_on(msg.kind, msg.mb_id)
                if msg.kind == MsgType.STOP:
                    self.pending.commit_all()
                    self.tracer.flush()
                    self.comm.join()
                    return
                continue
            batch: StageBatch = msg.obj
            idle = wait.duration
            if batch.ring_was_empty:  # waiting for work that did not exist yet is not a bubble
                idle = min(idle, max(wait.end - batch.launched_at, 0.0))
            self.meter.idle(idle)
            self._run_batch(batch, proxy.tensors)

    def _next_message(self) -> Message:
        """The next BATCH / STOP / PING (or HiCache's TIERS / QUERY / READ); the trace is flushed before
        blocking (nothing buffered is lost if the rank idles or dies)."""
        wanted = (MsgType.BATCH, MsgType.STOP, MsgType.PING, MsgType.TIERS, MsgType.QUERY, MsgType.READ)
        msg = self.comm.inbox.take(wanted, block=False)
        if msg is None:
            self.tracer.flush()
            msg = self.comm.inbox.take(wanted)
        return msg

    def _run_batch(self, batch: StageBatch, tensors: dict) -> None:
        runner = self.runner
        self.pending.forward_started(batch.mb_id)
        with self.tracer.span("forward", **batch.trace_args(self.pp_rank)) as fwd:
            if batch.is_idle:  # attention DP: another replica's micro-batch has tokens
                out = runner.forward_idle(batch.dp, PPProxyTensors(tensors))
                if self.is_last:
                    out = ForwardResult([], None, None)
            else:
                batch.apply_rows(runner.req_to_token_pool.req_to_token)
                out = runner.forward_stage(batch.to_worker_batch(), PPProxyTensors(tensors), dp=batch.dp)
        self.meter.busy(fwd.duration)
        if self.pd is not None:
            self.pd.after_forward(batch)  # PD prefill: this stage's layers of the chunk start moving
        batch.stage_forward_s.append(fwd.duration)
        batch.stage_bubble.append(self.meter.ratio())
        self.num_micro_batches += 1
        with self.tracer.span("send", mb=batch.mb_id):
            self.pending.commit(batch.mb_id)
            if self.is_last:
                assert isinstance(out, ForwardResult)
                sent = self.comm.send_return(MsgType.OUTPUT, batch.mb_id, StageOutput.from_result(batch, out))
                self.pending.add(batch.mb_id, sent)
            else:
                assert isinstance(out, PPProxyTensors)
                self.pending.add(batch.mb_id, self.comm.send_next(MsgType.BATCH, batch.mb_id, batch))
                self.pending.add(
                    batch.mb_id, self.comm.send_next(MsgType.PROXY, batch.mb_id, tensors=out.tensors)
                )

    def _pass_on(self, kind: int, mb_id: int) -> None:
        """Control messages go round the ring: to the next stage, or from the last back to stage 0."""
        if self.is_last:
            sent = self.comm.send_return(kind, mb_id)
        else:
            sent = self.comm.send_next(kind, mb_id)
        if sent is not None:
            sent.wait()
