"""Pipeline parallelism: stage 0's micro-batch ring (`PPDriver`) and the process entry of every
rank when `--pp-size > 1` (`build_pp_rank`).

Stage 0 decides, the other stages follow (docs/architecture.md, "Pipeline parallelism"): only the
ranks of stage 0 run a `Scheduler` (policy, radix cache, allocator); inside stage 0 the tp ranks
are mirrors kept identical by the entry rank broadcasting, each iteration, the tokenizer messages
and the sampled outputs it received. Each iteration of the ring on stage 0:

1. entry rank: take the tokenizer's messages and the outputs that came back from the last stage
   (without blocking, unless the ring is full or nothing can be scheduled while something is in
   flight); broadcast them inside the stage; every rank applies them, outputs in micro-batch order
   (`Scheduler.process_result`);
2. if fewer than `pp_size + pp_async_batch_depth` micro-batches are in flight: schedule the next
   one (at most `--pp-max-micro-batch-size` requests, and 1/pp_size of the decoding requests, so
   decodes are spread over the ring), run stage 0's layers and `isend` the
   micro-batch (BATCH) and its activations (PROXY) to stage 1; the sends are committed before
   their ring slot is reused;
3. send the outputs due to the detokenizer (entry rank).

A request due a token is not schedulable until its output is back, but a prefill chunk that does
not sample does not block: chunk k+1 of a long prompt enters stage 0 while chunk k runs on later
stages, and decodes of other requests fill the other slots.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch.distributed as dist

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.managers.io_struct import SchedulerReadyInfo
from sglang.srt.managers.pp_comm import PPComm
from sglang.srt.managers.pp_messages import MsgType, StageBatch, StageOutput
from sglang.srt.managers.pp_stage import PendingRing, PPStageWorker, stage_ready_info
from sglang.srt.managers.pp_trace import PPTracer, merge_trace, now_s, parts_signature
from sglang.srt.managers.schedule_batch import ModelWorkerBatch, ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.metrics.bubble import BubbleMeter
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
class _InFlight:
    mb_id: int
    batch: ScheduleBatch
    rids: frozenset


class PPDriver:
    """Stage 0's loop (every tp rank of stage 0 runs one; the entry rank owns `io`)."""

    def __init__(
        self,
        scheduler: Scheduler,
        groups: ParallelGroups,
        comm: PPComm,
        io: Any = None,
        tracer: Optional[PPTracer] = None,
    ):
        args = scheduler.server_args
        self.scheduler = scheduler
        self.groups = groups
        self.comm = comm
        self.io = io
        self.is_entry = groups.is_entry_rank
        self.tracer = tracer or PPTracer(None, groups.world_rank, 0, groups.tp.rank)
        self.ring_size = groups.pp.size + args.pp_async_batch_depth
        self.max_mb_reqs: Optional[int] = args.pp_max_micro_batch_size  # None: token budget only
        self.inflight: deque[_InFlight] = deque()
        self.pending = PendingRing(self.ring_size, self.tracer)
        self.next_mb_id = 0
        self.meter = BubbleMeter()
        self.stats = PPStats()
        self._must_wait = False
        self._last_ring_traffic = time.monotonic()
        self._trace_signature: tuple = ()

    # ------------------------------------------------------------------ loop
    def run(self, stop: Optional[Callable[[], bool]] = None) -> None:
        """Serve until `stop()` (asked on the entry rank when the ring is idle) returns True."""
        while not self.iterate(stop):
            pass

    def iterate(self, stop: Optional[Callable[[], bool]] = None) -> bool:
        """One iteration of the ring; True when asked to stop."""
        if self.tracer.enabled and not self.scheduler.has_work and not self.inflight:
            self.tracer.flush()  # every rank of stage 0 writes its part before it may block
        msgs, outputs, halt, ping = self._exchange(stop)
        for msg in msgs:
            reply = self.scheduler.handle_message(msg)
            if reply is not None and self.io is not None:
                self.io.send_to_tokenizer.send_pyobj(reply)
        for out in outputs:
            self._apply_output(out)
        if halt:
            return True
        if ping:
            self._send_control(MsgType.PING)
        launched = False
        if len(self.inflight) < self.ring_size and self.scheduler.has_work:
            t0 = now_s()
            batch, wb = self.scheduler.schedule(max_reqs=self.max_mb_reqs, max_decodes=self._decode_share())
            if wb is not None:
                self.tracer.complete("schedule", t0, now_s(), reqs=len(batch.items), tokens=batch.num_tokens)
                self._launch(batch, wb)
                launched = True
        # Nothing launched but something in flight: the next iteration waits for an output.
        self._must_wait = bool(self.inflight) and not launched
        out = self.scheduler.collect_outputs()
        if out is not None and self.io is not None:
            self.io.send_to_detokenizer.send_pyobj(out)
        return False

    def _decode_share(self) -> int:
        """Decodes per micro-batch: the decoding requests spread evenly over the pp stages, so
        decode micro-batches keep every stage busy instead of one big batch and empty slots."""
        decoding = sum(1 for r in self.scheduler.running if not r.is_prefilling)
        return max(1, -(-decoding // self.groups.pp.size))

    def _exchange(self, stop: Optional[Callable[[], bool]]) -> tuple[list, list[StageOutput], bool, bool]:
        """Entry rank: gather tokenizer messages and returned outputs; share them with the stage."""
        packet: Any = None
        if self.is_entry:
            idle = not self.scheduler.has_work and not self.inflight
            if idle:
                self._on_idle()
            msgs = self.io.recv_all(block=idle) if self.io is not None else []
            inbox = self.comm.inbox
            inbox.take_all(MsgType.PING)
            outputs = [m.obj for m in inbox.take_all(MsgType.OUTPUT)]
            if self._must_wait and not outputs:
                self.tracer.flush()
                t0 = now_s()
                outputs = [inbox.take(MsgType.OUTPUT).obj] + [m.obj for m in inbox.take_all(MsgType.OUTPUT)]
                t1 = now_s()
                self.meter.idle(t1 - t0)
                self.stats.output_waits += 1
                self.tracer.complete("output wait", t0, t1, in_flight=len(self.inflight))
            halt = idle and not msgs and stop is not None and bool(stop())
            ping = idle and time.monotonic() - self._last_ring_traffic > KEEPALIVE_S
            packet = (msgs, outputs, halt, ping)
        if self.groups.tp.size > 1:
            packet = self.groups.tp.broadcast_object(packet, src=0)
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
    def _launch(self, batch: ScheduleBatch, wb: ModelWorkerBatch) -> None:
        mb_id = self.next_mb_id
        self.next_mb_id += 1
        self.pending.commit(mb_id)  # this ring slot's previous sends must be done before reuse
        rids = frozenset(item.req.rid for item in batch.items)
        if any(rids & f.rids for f in self.inflight):
            self.stats.overlapped += 1
        msg = StageBatch.from_schedule(mb_id, batch, wb, self.scheduler.runner.req_to_token_pool.req_to_token)
        msg.ring_was_empty = not self.inflight
        t0 = now_s()
        msg.launched_at = t0
        proxies = self.scheduler.runner.forward_stage(wb)
        t1 = now_s()
        self.meter.busy(t1 - t0)
        self.tracer.complete("forward", t0, t1, **msg.trace_args(0))
        msg.stage_forward_s.append(t1 - t0)
        msg.stage_bubble.append(self.meter.ratio())
        self.pending.add(mb_id, self.comm.send_next(MsgType.BATCH, mb_id, msg))
        self.pending.add(mb_id, self.comm.send_next(MsgType.PROXY, mb_id, tensors=proxies.tensors))
        self.tracer.complete("send", t1, now_s(), mb=mb_id)
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
        t0 = now_s()
        self.scheduler.process_result(entry.batch, out.to_forward_result())
        self.scheduler.observe_chunk(entry.batch, out.stage_forward_s)
        self.tracer.complete("process result", t0, now_s(), mb=out.mb_id)
        own = self.meter.ratio()
        ratios = [own] + list(out.stage_bubble[1:])
        self.scheduler.pp_bubble_ratio = [0.0 if r is None else float(r) for r in ratios]

    # ------------------------------------------------------------------ shutdown
    def _send_control(self, mtype: MsgType) -> None:
        self.comm.send_next(mtype, -1).wait()
        self._last_ring_traffic = time.monotonic()

    def shutdown(self) -> None:
        """Send STOP round the ring and wait until it comes back (outputs still in flight are
        dropped); every rank of stage 0 calls it after `run` returned."""
        self.pending.commit_all()
        self._send_control(MsgType.STOP)
        if self.comm.receives_outputs:
            while self.comm.inbox.take((MsgType.OUTPUT, MsgType.PING, MsgType.STOP)).type != MsgType.STOP:
                pass
        self.tracer.flush()
        self.comm.join()


# ---------------------------------------------------------------------------- process entry
class PPRank:
    """One rank of a pipeline-parallel engine: stage 0 runs a `PPDriver`, later stages a `PPStageWorker`."""

    def __init__(
        self,
        loop: Any,
        info: SchedulerReadyInfo,
        scheduler: Optional[Scheduler],
        comm: PPComm,
        tracer: PPTracer,
        chunk_policy: Any = None,
    ):
        self.loop = loop
        self.chunk_policy = chunk_policy  # dynamic chunking: equal on every rank; stage 0 uses it
        self.info = info
        self.scheduler = scheduler
        self.comm = comm
        self.tracer = tracer

    @property
    def is_first_stage(self) -> bool:
        return self.scheduler is not None

    def run(self, stop: Optional[Callable[[], bool]] = None) -> None:
        """Serve; returns (stage 0: when `stop()` says so, after STOP went round; later stages:
        when STOP arrives). A server never stops its ring: its processes are terminated."""
        self.loop.run(stop)
        if isinstance(self.loop, PPDriver):
            self.loop.shutdown()


def build_pp_rank(
    server_args: ServerArgs,
    groups: ParallelGroups,
    port_args: Any = None,
    tokenizer: Any = None,
    io: Any = None,
) -> PPRank:
    """Build this rank's part of the pipeline (collective: every rank calls it, in any stage).

    The entry rank gets `io` (a `SchedulerIO` on `port_args` unless one is given, e.g. a test
    double with `recv_all(block)`, `send_to_detokenizer` and `send_to_tokenizer`)."""
    from sglang.srt.managers.chunk_profiler import build_dynamic_chunking
    from sglang.srt.model_executor.model_runner import ModelRunner

    tracer = PPTracer(server_args.pp_trace_path, groups.world_rank, groups.pp.rank, groups.tp.rank)
    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    if groups.pp.is_first:
        scheduler = Scheduler(server_args, groups=groups, tokenizer=tokenizer)
        # collective with the later stages' call below: profile every stage, fit on stage 0
        policy = build_dynamic_chunking(server_args, scheduler.runner, groups)
        scheduler.set_chunk_policy(policy, groups.pp.size)
        comm = PPComm(groups, backend, scheduler.runner.device)
        if groups.is_entry_rank and io is None and port_args is not None:
            from sglang.srt.managers.scheduler_io import SchedulerIO

            io = SchedulerIO(port_args)
        driver = PPDriver(scheduler, groups, comm, io if groups.is_entry_rank else None, tracer)
        logger.info(
            "pipeline stage 0 of %d: layers [%d, %d), ring of %d micro-batches (request cap %s)",
            groups.pp.size, scheduler.runner.start_layer, scheduler.runner.end_layer, driver.ring_size,
            driver.max_mb_reqs,
        )  # fmt: skip
        return PPRank(driver, scheduler.ready_info(), scheduler, comm, tracer, policy)
    runner = ModelRunner(server_args, groups)
    policy = build_dynamic_chunking(server_args, runner, groups)  # this stage's profile goes into stage 0's fit
    comm = PPComm(groups, backend, runner.device)
    ring_size = groups.pp.size + server_args.pp_async_batch_depth
    worker = PPStageWorker(runner, groups, comm, tracer, ring_size)
    logger.info(
        "pipeline stage %d of %d: layers [%d, %d)", groups.pp.rank, groups.pp.size, runner.start_layer, runner.end_layer
    )
    return PPRank(worker, stage_ready_info(runner), None, comm, tracer, policy)
