"""One rank of a pipeline-parallel engine (`--pp-size > 1`): assembled by `build_pp_rank`.

Stage 0 runs a `PPDriver` (which owns the `Scheduler`), later stages a `PPStageWorker`. Building
is collective: every rank of every stage calls `build_pp_rank` at the same point of its start-up
(the KV plan is agreed over the world inside `ModelRunner`, dynamic-chunking profiling gathers
over the world, and the ring's links are process groups every rank creates).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Union

import torch.distributed as dist

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.distributed.pp_comm import PPComm
from sglang.srt.managers.dynamic_chunking.policy import ChunkPlanner
from sglang.srt.managers.io_struct import SchedulerReadyInfo
from sglang.srt.managers.pp.driver import PPDriver
from sglang.srt.managers.pp.hicache_ring import StageHiCache, io_agree
from sglang.srt.managers.pp.messages import MsgType
from sglang.srt.managers.pp.stage import PPStageWorker, stage_ready_info
from sglang.srt.managers.pp.trace import PPTracer
from sglang.srt.managers.scheduler.cache_manager import build_stage_tiers
from sglang.srt.managers.scheduler.chunk_profiler import build_dynamic_chunking
from sglang.srt.managers.scheduler.scheduler import Scheduler
from sglang.srt.managers.scheduler.scheduler_io import SchedulerIO, SchedulerPort, ThreadOutputSender
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import PortArgs, ServerArgs

logger = logging.getLogger(__name__)


class PPRank:
    """One rank of a pipeline-parallel engine: stage 0 runs a `PPDriver`, later stages a `PPStageWorker`."""

    def __init__(
        self,
        loop: Union[PPDriver, PPStageWorker],
        info: SchedulerReadyInfo,
        comm: PPComm,
        tracer: PPTracer,
        chunk_policy: Optional[ChunkPlanner] = None,
    ):
        self.loop = loop
        self.chunk_policy = chunk_policy  # dynamic chunking: equal on every rank; stage 0 uses it
        self.info = info
        self.comm = comm
        self.tracer = tracer

    @property
    def scheduler(self) -> Optional[Scheduler]:
        """Stage 0's scheduler (None on later stages)."""
        return self.loop.scheduler if isinstance(self.loop, PPDriver) else None

    @property
    def is_first_stage(self) -> bool:
        return isinstance(self.loop, PPDriver)

    def run(self, stop: Optional[Callable[[], bool]] = None) -> None:
        """Serve; returns (stage 0: when `stop()` says so, after STOP went round; later stages:
        when STOP arrives). A server never stops its ring: its processes are terminated."""
        self.loop.run(stop)
        if isinstance(self.loop, PPDriver):
            self.loop.shutdown()


def build_pp_rank(
    server_args: ServerArgs,
    groups: ParallelGroups,
    port_args: Optional[PortArgs] = None,
    tokenizer: Any = None,
    io: Optional[SchedulerPort] = None,
) -> PPRank:
    """Build this rank's part of the pipeline (collective: every rank calls it, in any stage).

    The entry rank gets `io` (a `SchedulerIO` on `port_args` unless one is given, e.g. a test
    double with `recv_all(block)`, `reply(msg)` and `emit(out)`)."""
    tracer = PPTracer(server_args.pp_trace_path, groups.world_rank, groups.pp.rank, groups.tp.rank)
    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    runner = ModelRunner(server_args, groups)
    # collective over the world: every stage profiles its layers, every rank fits the same policy
    policy = build_dynamic_chunking(server_args, runner, groups)
    comm = PPComm(groups, MsgType.STOP, backend, runner.device)
    agree_reads = io_agree(server_args, groups)  # collective: the later stages' storage I/O threads
    if groups.pp.is_first:
        if groups.is_replica_entry and io is None and port_args is not None:
            io = SchedulerIO(port_args, groups.dp_rank, groups.layout.attn_dp)
        driver = PPDriver(
            server_args,
            groups,
            runner,
            comm,
            io=io if groups.is_replica_entry else None,
            tracer=tracer,
            chunk_policy=policy,
            tokenizer=tokenizer,
        )
        # PD prefill: answers once the decode side has the KV
        if groups.is_replica_entry and port_args is not None:
            driver.scheduler.disagg.set_output_sink(ThreadOutputSender(port_args))
        logger.info(
            "pipeline stage 0 of %d: layers [%d, %d), ring of %d micro-batches (request cap %s)",
            groups.pp.size,
            runner.start_layer,
            runner.end_layer,
            driver.ring_size,
            driver.max_mb_reqs,
        )
        return PPRank(driver, driver.scheduler.ready_info(), comm, tracer, policy)
    ring_size = groups.pp.size + server_args.pp_async_batch_depth
    from sglang.srt.disaggregation.factory import create_stage_transfer

    pd = create_stage_transfer(server_args, groups, runner)  # PD prefill: this stage sends its layers' KV
    tiers = build_stage_tiers(
        server_args, runner, groups, agree_reads
    )  # HiCache: this stage's host pool / storage
    hicache = StageHiCache(tiers, comm, groups.pp.is_last) if tiers is not None else None
    worker = PPStageWorker(runner, groups, comm, tracer, ring_size, pd=pd, hicache=hicache)
    logger.info(
        "pipeline stage %d of %d: layers [%d, %d)",
        groups.pp.rank,
        groups.pp.size,
        runner.start_layer,
        runner.end_layer,
    )
    return PPRank(worker, stage_ready_info(runner), comm, tracer, policy)
