"""Start-up profiling for dynamic chunking: every pipeline stage times one-request prefills on its
own layers, the lists are gathered over the world and merged (slowest stage per length), and the
entry stage fits its chunk policy on the merged numbers (docs/dynamic_chunking.md).

This module is the policy side (which lengths, gather, fit); running one prefill on a stage is
`model_executor/stage_profiler.py` (`StagePrefillProfiler`).

Collective: every rank of every stage calls `build_dynamic_chunking` at the same point of its
start-up (after its `ModelRunner` exists), or none does (the decision depends on the flags only).
"""

from __future__ import annotations

import logging
from typing import Optional

from sglang.srt import envs
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.managers.dynamic_chunking import (
    build_chunk_policy,
    merge_stage_latencies,
    profile_lengths,
    time_prefills,
)
from sglang.srt.managers.dynamic_chunking.policy import ChunkPlanner
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_executor.stage_profiler import StagePrefillProfiler
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


def shared_profile(runner: ModelRunner, groups: ParallelGroups, lengths: list[int]) -> list[float]:
    """This rank's prefill times, gathered over the world and merged (element-wise max)."""
    from sglang.srt.platforms import current_platform

    profiler = StagePrefillProfiler(runner)
    mine = time_prefills(profiler.run, lengths, current_platform().synchronize)
    every = groups.world.all_gather_object(mine) if groups.world.size > 1 else [mine]
    return merge_stage_latencies(every)


def build_dynamic_chunking(
    server_args: ServerArgs, runner: ModelRunner, groups: ParallelGroups
) -> Optional[ChunkPlanner]:
    """The fitted chunk policy (upstream predictor or auto planner), or None for fixed chunks.

    Every rank profiles and fits on the same merged numbers, so every rank returns an equal
    policy; only the entry stage uses it (later stages follow stage 0's micro-batches)."""
    policy = build_chunk_policy(server_args, runner.model_config.context_len)
    if policy is None:
        return None
    c = int(server_args.chunked_prefill_size)
    points = envs.SGLANG_DYNAMIC_CHUNKING_PROFILE_POINTS.get()
    lengths = profile_lengths(c, groups.tp.size, server_args.page_size, n=points)
    longest = StagePrefillProfiler(runner).max_length()
    lengths = [n for n in lengths if n <= longest]
    latencies = shared_profile(runner, groups, lengths)
    fitted = policy.fit(lengths, latencies)
    logger.info(
        "dynamic chunking (%s): profiled %d prefills of %d..%d tokens on every stage, fit %s",
        "auto" if server_args.dynamic_chunking_mode == "auto" else "upstream",
        len(lengths),
        min(lengths, default=0),
        max(lengths, default=0),
        "accepted"
        if fitted
        else "rejected (fixed chunks)"
        if server_args.dynamic_chunking_mode != "auto"
        else "no prior",
    )
    return policy
