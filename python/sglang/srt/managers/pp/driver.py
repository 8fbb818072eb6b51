"""Pipeline parallelism: stage 0's loop (`PPDriver`), which drives the micro-batch ring.

Stage 0 decides, the other stages follow (docs/architecture.md, "Pipeline parallelism"): only the
ranks of stage 0 run a `Scheduler` (policy, radix cache, allocator); inside stage 0 the tp ranks
are mirrors kept identical by the entry rank broadcasting, each iteration, the tokenizer messages
and the sampled outputs it received. Each iteration of the ring on stage 0:

1. entry rank: take the tokenizer's messages and the outputs that came back from the last stage
   (without blocking, unless the ring is full or nothing can be scheduled while something is in
   flight); broadcast them inside the stage (an `ExchangePacket`); every rank applies them
   (`Scheduler.apply_messages`, the message step `Scheduler.event_loop` uses too), outputs in
   micro-batch order (`Scheduler.process_result`);
2. if fewer than `pp_size + pp_async_batch_depth` micro-batches are in flight: schedule the next
   one (at most `--pp-max-micro-batch-size` requests, and 1/pp_size of the decoding requests, so
   decodes are spread over the ring), run stage 0's layers and `isend` the
   micro-batch (BATCH) and its activations (PROXY) to stage 1; the sends are committed before
   their ring slot is reused;
3. send the outputs due to the detokenizer (entry rank).

A request due a token is not schedulable until its output is back, but a prefill chunk that does
not sample does not block: chunk k+1 of a long prompt enters stage 0 while chunk k runs on later
stages, and decodes of other requests fill the other slots.

With attention DP every replica of stage 0 runs a driver of its own (its entry rank owns its
sockets, broadcasts inside the replica) and the drivers launch in lockstep (`DPLockstep`): before
step 2 they agree that every replica has room in its ring and some has work; then each schedules
and they agree the counts, and every replica launches micro-batch j (IDLE when it has no tokens),
so every later stage runs micro-batch j of every replica together.

The driver owns its `Scheduler` (built with the chunk policy's budget and the driver's state as
explicit constructor arguments), the dynamic-chunking policy (it feeds `observe` the stage times
of returned micro-batches) and the per-stage bubble ratios, which reach
`Scheduler.internal_state()` through that state provider.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.distributed.pp_comm import PPComm
from sglang.srt.managers.dynamic_chunking.policy import ChunkPlanner
from sglang.srt.managers.pp.hicache_ring import RingQueries, send_tier_ops
from sglang.srt.managers.pp.messages import MsgType, StageBatch, StageOutput
from sglang.srt.managers.pp.stage import PendingRing
from sglang.srt.managers.pp.trace import PPTracer, merge_trace, parts_signature
from sglang.srt.managers.scheduler.dp_lockstep import DPLockstep
from sglang.srt.managers.scheduler.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler.scheduler import Scheduler
from sglang.srt.managers.scheduler.scheduler_io import SchedulerPort
from sglang.srt.metrics.bubble import BubbleMeter
from sglang.srt.model_executor.forward_batch import DPForwardInfo
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_executor.worker_batch import ModelWorkerBatch
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

KEEPALIVE_S = 600.0  # an idle ring sends a PING round this often (links time out after a day)


@dataclass
class PPStats:
    """What the ring did (tests and logs)."""

    micro_batches: int = 0
    max_in_flight: int = 0
    # micro-batches launched while another micro-batch of one of their requests was still in flight
    # (chunk k+1 of a prompt entering stage 0 while chunk k is on a later stage)
    overlapped: int = 0
    output_waits: int = 0


@dataclass
class ExchangePacket:
    """What the entry rank gathered in one iteration; every rank of stage 0 applies the same."""

    msgs: list = field(default_factory=list)  # tokenizer messages
    outputs: list[StageOutput] = field(default_factory=list)  # returned micro-batches, in launch order
    halt: bool = False  # the ring is idle and `stop()` said so
    ping: bool = False  # the ring has been idle long enough to send a keep-alive round


@dataclass
class _InFlight:
    mb_id: int
    batch: ScheduleBatch
    rids: frozenset


class PPDriver:
    """Stage 0's loop (every tp rank of stage 0 runs one; the entry rank owns `io`)."""

    def __init__(
        self,
        server_args: ServerArgs,
        groups: ParallelGroups,
        runner: ModelRunner,
        comm: PPComm,
        io: Optional[SchedulerPort] = None,
        tracer: Optional[PPTracer] = None,
        chunk_policy: Optional[ChunkPlanner] = None,
        tokenizer: Any = None,
    ):
        self.groups = groups
        self.comm = comm
        self.io = io
        self.is_entry = groups.is_replica_entry
        self.dp = DPLockstep(groups) if groups.layout.attn_dp > 1 else None
        self.tracer = tracer or PPTracer(None, groups.world_rank, 0, groups.tp.rank)
        self.chunk_policy = chunk_policy  # dynamic chunking (None: fixed chunks)
        self.bubble_ratios: list[float] = []  # each stage's bubble ratio (index = pp rank)
        self.scheduler = Scheduler(
            server_args,
            groups=groups,
            tokenizer=tokenizer,
            runner=runner,
            chunk_budget=None if chunk_policy is None else self._chunk_budget,
            extra_state=self.ring_state,
        )
        self.scheduler.cache.attach_pipeline(RingQueries(comm, groups))  # HiCache: tiers on every stage
        self.ring_size = groups.pp.size + server_args.pp_async_batch_depth
        self.max_mb_reqs: Optional[int] = server_args.pp_max_micro_batch_size  # None: token budget only
        self.inflight: deque[_InFlight] = deque()
        self.pending = PendingRing(self.ring_size, self.tracer)
        self.next_mb_id = 0
        self.meter = BubbleMeter()
        self.stats = PPStats()
        self._must_wait = False
        self._last_ring_traffic = time.monotonic()
        self._trace_signature: tuple = ()

    # ------------------------------------------------------------------ state
    def ring_state(self) -> dict:
        """The driver's entries of `Scheduler.internal_state()` (and so of the metrics)."""
        return {
            "pp_bubble_ratio": list(self.bubble_ratios),
            **(self.dp.state() if self.dp is not None else {}),
        }

    def _chunk_budget(self, fill_len: int, prefix_len: int) -> int:
        """`SchedulePolicy`'s budget function: the policy's chunk size for this ring."""
        return self.chunk_policy.chunk_budget(fill_len, prefix_len, self.groups.pp.size)

    def _observe_chunk(self, batch: ScheduleBatch, stage_forward_s: list[float]) -> None:
        """The policy learns from each finished micro-batch that was one prefill chunk alone: its
        slowest stage's forward time (the same numbers reach every rank of stage 0)."""
        if self.chunk_policy is None or len(batch.items) != 1 or not stage_forward_s:
            return
        item = batch.items[0]
        if item.num_tokens > 1:
            self.chunk_policy.observe(item.start, item.num_tokens, max(stage_forward_s))

    # ------------------------------------------------------------------ loop
    def run(self, stop: Optional[Callable[[], bool]] = None) -> None:
        """Serve until `stop()` (asked on the entry rank when the ring is idle) returns True."""
        while not self.iterate(stop):
            pass

    def iterate(self, stop: Optional[Callable[[], bool]] = None) -> bool:
        """One iteration of the ring; True when asked to stop."""
        if self.tracer.enabled and not self.scheduler.has_work and not self.inflight:
            self.tracer.flush()  # every rank of stage 0 writes its part before it may block
        packet = self._exchange(stop)
        self.scheduler.apply_messages(packet.msgs, self.io)
        for out in packet.outputs:
            self._apply_output(out)
        self.scheduler.disagg_step()  # PD: transfer queues <-> the scheduler's lists
        room = len(self.inflight) < self.ring_size
        launch_ok = room and self.scheduler.has_work
        if self.dp is not None:  # launch and halt together with the other replicas or not at all
            launch_ok, packet.halt = self.dp.all_ready(
                room, self.scheduler.has_work or bool(self.inflight), packet.halt
            )
        if packet.halt:
            return True
        if packet.ping:
            self._send_control(MsgType.PING)
        if self.dp is None:
            launched = launch_ok and self._schedule_and_launch()
        else:
            launched = launch_ok and self._dp_schedule_and_launch()
        # Nothing launched but something in flight: the next iteration waits for an output.
        self._must_wait = bool(self.inflight) and not launched
        send_tier_ops(self.comm, self.scheduler.cache.take_tier_ops())  # HiCache: copies of this iteration
        out = self.scheduler.collect_outputs()
        if self.io is not None:
            if out is not None:
                self.io.emit(out)
            if self.dp is not None:
                report = self.scheduler.load_report()
                if report is not None:
                    self.io.report(report)
        return False

    def _schedule(self):
        with self.tracer.span("schedule") as span:
            batch, wb = self.scheduler.schedule(max_reqs=self.max_mb_reqs, max_decodes=self._decode_share())
            if wb is None:
                span.drop()
            else:
                span.set(reqs=len(batch.items), tokens=batch.num_tokens)
        return batch, wb

    def _schedule_and_launch(self) -> bool:
        batch, wb = self._schedule()
        if wb is None:
            return False
        self._launch(batch, wb)
        return True

    def _dp_schedule_and_launch(self) -> bool:
        """Attention DP, every replica ready: schedule, agree the counts, launch (IDLE if no tokens
        here) when any replica has tokens."""
        has_work = self.scheduler.has_work or bool(self.inflight)
        batch, wb = self._schedule() if self.scheduler.has_work else (None, None)
        tokens = len(wb.input_ids) if wb is not None else 0
        info = self.dp.agree(tokens, wb.num_logit_rows if wb is not None else 0, has_work)
        if info is None:
            return False
        if wb is None:
            self._launch_idle(info)
        else:
            self._launch(batch, wb, info)
        return True

    def _decode_share(self) -> int:
        """Decodes per micro-batch: the decoding requests spread evenly over the pp stages, so
        decode micro-batches keep every stage busy instead of one big batch and empty slots."""
        decoding = sum(1 for r in self.scheduler.running if not r.is_prefilling)
        return max(1, -(-decoding // self.groups.pp.size))

    def _exchange(self, stop: Optional[Callable[[], bool]]) -> ExchangePacket:
        """Entry rank: gather tokenizer messages and returned outputs; share them with the stage."""
        packet: Optional[ExchangePacket] = None
        if self.is_entry:
            idle = not self.scheduler.has_work and not self.inflight
            if idle:
                self._on_idle()
            block = idle and (self.dp is None or not self.dp.any_work)  # DP: nobody waits for us
            msgs = self.io.recv_all(block=block) if self.io is not None else []
            inbox = self.comm.inbox
            inbox.take_all(MsgType.PING)
            outputs = [m.obj for m in inbox.take_all(MsgType.OUTPUT)]
            if self._must_wait and not outputs:
                self.tracer.flush()
                with self.tracer.span("output wait", in_flight=len(self.inflight)) as wait:
                    outputs = [inbox.take(MsgType.OUTPUT).obj] + [
                        m.obj for m in inbox.take_all(MsgType.OUTPUT)
                    ]
                self.meter.idle(wait.duration)
                self.stats.output_waits += 1
            packet = ExchangePacket(
                msgs=msgs,
                outputs=outputs,
                halt=idle and not msgs and stop is not None and bool(stop()),
                ping=idle and time.monotonic() - self._last_ring_traffic > KEEPALIVE_S,
            )
        if self.groups.replica.size > 1:  # the stage's tp group when dp = 1
            packet = self.groups.replica.broadcast_object(packet, src=0)
        return packet

    def _on_idle(self) -> None:
        """The ring is empty: (re)write the merged trace when a rank's part grew."""
        if not self.tracer.enabled:
            return
        signature = parts_signature(self.tracer.path)
        if signature != self._trace_signature:
            merge_trace(self.tracer.path)
            self._trace_signature = signature

    # ------------------------------------------------------------------ micro-batches
    def _launch(self, batch: ScheduleBatch, wb: ModelWorkerBatch, dp: Optional[DPForwardInfo] = None) -> None:
        runner = self.scheduler.runner
        msg = StageBatch.from_schedule(self.next_mb_id, batch, wb, runner.req_to_token_pool.req_to_token)
        msg.dp = dp
        self._send_micro_batch(msg, batch, lambda: runner.forward_stage(wb, dp=dp))

    def _launch_idle(self, dp: DPForwardInfo) -> None:
        """Attention DP: this replica's empty part of a micro-batch another replica has tokens for."""
        runner = self.scheduler.runner
        self._send_micro_batch(
            StageBatch.idle(self.next_mb_id, dp), ScheduleBatch(), lambda: runner.forward_idle(dp)
        )

    def _send_micro_batch(self, msg: StageBatch, batch: ScheduleBatch, forward: Callable[[], Any]) -> None:
        mb_id = self.next_mb_id
        self.next_mb_id += 1
        self.pending.commit(mb_id)  # this ring slot's previous sends must be done before reuse
        send_tier_ops(self.comm, self.scheduler.cache.take_tier_ops())  # HiCache: ahead of the batch
        rids = frozenset(item.req.rid for item in batch.items)
        if any(rids & f.rids for f in self.inflight):
            self.stats.overlapped += 1
        msg.ring_was_empty = not self.inflight
        disagg = self.scheduler.disagg
        msg.pd_rooms = disagg.rooms_of(batch)  # PD prefill: later stages send their layers' KV of these rooms
        self.pending.forward_started(mb_id)
        with self.tracer.span("forward", **msg.trace_args(0)) as fwd:
            msg.launched_at = fwd.start
            proxies = forward()
        disagg.after_forward(batch)  # PD prefill: stage 0's layers of this chunk start moving
        self.meter.busy(fwd.duration)
        msg.stage_forward_s.append(fwd.duration)
        msg.stage_bubble.append(self.meter.ratio())
        with self.tracer.span("send", mb=mb_id):
            self.pending.add(mb_id, self.comm.send_next(MsgType.BATCH, mb_id, msg))
            self.pending.add(mb_id, self.comm.send_next(MsgType.PROXY, mb_id, tensors=proxies.tensors))
        self.inflight.append(_InFlight(mb_id, batch, rids))
        self.stats.micro_batches += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, len(self.inflight))
        self._last_ring_traffic = time.monotonic()

    def _apply_output(self, out: StageOutput) -> None:
        if not self.inflight:
            raise RuntimeError(f"output of micro-batch {out.mb_id} arrived with nothing in flight")
        entry = self.inflight.popleft()
        if entry.mb_id != out.mb_id:
            raise RuntimeError(f"output of micro-batch {out.mb_id} arrived, expected {entry.mb_id}")
        with self.tracer.span("process result", mb=out.mb_id):
            self.scheduler.process_result(entry.batch, out.to_forward_result())
            self._observe_chunk(entry.batch, out.stage_forward_s)
        ratios = [self.meter.ratio()] + list(out.stage_bubble[1:])
        self.bubble_ratios = [0.0 if r is None else float(r) for r in ratios]

    # ------------------------------------------------------------------ shutdown
    def _send_control(self, kind: MsgType) -> None:
        self.comm.send_next(kind, -1).wait()
        self._last_ring_traffic = time.monotonic()

    def shutdown(self) -> None:
        """Send STOP round the ring and wait until it comes back (outputs still in flight are
        dropped); every rank of stage 0 calls it after `run` returned."""
        self.pending.commit_all()
        self._send_control(MsgType.STOP)
        if self.comm.receives_outputs:
            while self.comm.inbox.take((MsgType.OUTPUT, MsgType.PING, MsgType.STOP)).kind != MsgType.STOP:
                pass
        self.tracer.flush()
        self.comm.join()
