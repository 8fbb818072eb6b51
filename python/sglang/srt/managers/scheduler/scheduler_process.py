"""Entry of a scheduler process (one per world rank): join the process groups, build this rank's
loop, report readiness, serve forever.

Without pipeline parallelism every rank runs `Scheduler.event_loop`; with `--pp-size > 1` it runs
its part of the ring (`managers/pp/rank.py`: stage 0 schedules, later stages follow). Keeping
the entry here lets `scheduler.py` know nothing of the ring.
"""

from __future__ import annotations

import logging
import traceback

from sglang.srt.distributed.parallel_state import ParallelGroups, ParallelLayout
from sglang.srt.managers.scheduler.dp_lockstep import DPLockstep
from sglang.srt.managers.scheduler.scheduler import Scheduler
from sglang.srt.managers.scheduler.scheduler_io import HeartbeatSender, SchedulerIO, ThreadOutputSender
from sglang.srt.server_args import PortArgs, ServerArgs

logger = logging.getLogger(__name__)


def run_scheduler_process(server_args: ServerArgs, port_args: PortArgs, rank: int, pipe_writer) -> None:
    """Entry of the scheduler process of world rank `rank`: join the process groups, build the
    scheduler, report readiness, then serve forever.

    Only the entry rank (pp 0, tp 0) owns ZMQ sockets. It broadcasts every incoming message to
    the other ranks of its stage, so every rank applies the same messages in the same order and
    its request mirror, and therefore its batch, stays identical (pp-cp.md invariant 1).
    With attention DP each replica is such an engine of its own (its entry rank owns its sockets
    and broadcasts inside the replica), and the replicas agree every step (`DPLockstep`).
    With `--pp-size > 1` the rank runs its part of the pipeline ring instead
    (`managers/pp/driver.py`: stage 0 schedules, later stages follow).
    """
    try:
        groups = init_rank_groups(server_args, rank)
        tokenizer = None
        if not server_args.skip_tokenizer_init and groups.pp.is_first:
            from sglang.srt.utils.hf_transformers_utils import get_tokenizer

            tokenizer = get_tokenizer(server_args.tokenizer_path, server_args.trust_remote_code)
        if groups.pp.size > 1:
            from sglang.srt.managers.pp.rank import build_pp_rank

            pp_rank = build_pp_rank(server_args, groups, port_args=port_args, tokenizer=tokenizer)
            info = pp_rank.info
        else:
            lockstep = DPLockstep(groups) if groups.layout.attn_dp > 1 else None
            scheduler = Scheduler(server_args, groups=groups, tokenizer=tokenizer, dp_lockstep=lockstep)
            io = (
                SchedulerIO(port_args, groups.dp_rank, groups.layout.attn_dp)
                if groups.is_replica_entry
                else None
            )
            if io is not None:
                scheduler.disagg.set_output_sink(ThreadOutputSender(port_args))  # PD prefill: early answers
            info = scheduler.ready_info()
    except Exception:
        pipe_writer.send({"status": "error", "error": traceback.format_exc()})
        raise
    pipe_writer.send({"status": "ready", "info": info})
    logger.info("scheduler ready")
    start_watchdog(pp_rank.scheduler if groups.pp.size > 1 else scheduler, groups, port_args)
    if groups.pp.size > 1:
        pp_rank.run()
    else:
        scheduler.event_loop(io)


def start_watchdog(scheduler, groups: ParallelGroups, port_args: PortArgs) -> None:
    """Start the scheduler's watchdog thread (later pipeline stages have no scheduler: stage 0's
    watchdog sees a ring that stopped returning results); the entry rank's also sends heartbeats."""
    if scheduler is None:
        return
    dp_size = groups.layout.attn_dp
    sink = (lambda: HeartbeatSender(port_args, dp_size)) if groups.is_replica_entry else None
    scheduler.watchdog.publish(scheduler.internal_state, busy=False)  # the first heartbeat has a state
    scheduler.watchdog.start(heartbeat_sink=sink)


def init_rank_groups(server_args: ServerArgs, rank: int) -> ParallelGroups:
    """Bind the rank to its device (platforms/rank_device.py: `--device`'s platform, the
    node-local device, kernels loaded), join torch.distributed with that platform's backend (when
    the world has more than one rank) and build the groups."""
    from sglang.srt.distributed.init import init_rank_distributed

    layout = ParallelLayout.from_server_args(server_args)  # `--cp-size N` alone means tp = dp · cp
    return init_rank_distributed(
        layout,
        rank,
        server_args.device,
        server_args.dist_init_addr,
        server_args.dist_timeout,
        server_args.nnodes,
    )
