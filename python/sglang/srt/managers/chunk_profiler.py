"""Start-up profiling for dynamic chunking: every pipeline stage times one-request prefills on its
own layers, the lists are gathered over the world and merged (slowest stage per length), and the
entry stage fits its chunk policy on the merged numbers (docs/dynamic_chunking.md).

Collective: every rank of every stage calls `build_dynamic_chunking` at the same point of its
start-up (after its `ModelRunner` exists), or none does (the decision depends on the flags only).
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt import envs
from sglang.srt.layers.communicator import scatter_model_input
from sglang.srt.managers.dynamic_chunking import (
    build_chunk_policy,
    merge_stage_latencies,
    profile_lengths,
    time_prefills,
)
from sglang.srt.managers.dynamic_chunking.config import ChunkPolicy
from sglang.srt.managers.schedule_batch import ModelWorkerBatch
from sglang.srt.model_executor.forward_batch import PPProxyTensors
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class StagePrefillProfiler:
    """Runs a single-request prefill of `n` tokens through one stage's layers (zero activations
    on stages after the first), writing KV into slots no request holds yet."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.vocab = runner.model_config.vocab_size
        self.hidden = runner.model_config.hidden_size

    def max_length(self) -> int:
        """Longest prefill that fits: virtual slots [page, page + n) must exist."""
        runner = self.runner
        return min(runner.max_total_num_tokens - runner.kv_page_size, runner.model_config.context_len - 1)

    def run(self, n: int) -> None:
        runner = self.runner
        rows = runner.req_to_token_pool.alloc(1)
        if rows is None:
            raise RuntimeError("dynamic-chunking profiling: no free request row")
        row = rows[0]
        try:
            slots = torch.arange(runner.kv_page_size, runner.kv_page_size + n, dtype=torch.int64)
            runner.req_to_token_pool.req_to_token[row, :n] = slots.to(runner.req_to_token_pool.req_to_token.device)
            ids = [(i * 7919 + 13) % self.vocab for i in range(n)]
            wb = ModelWorkerBatch(
                input_ids=ids,
                positions=list(range(n)),
                out_cache_loc=slots,
                req_pool_indices=[row],
                prefix_lens=[0],
                extend_lens=[n],
                is_decode=False,
                sample_rows=[0],
                sampling_params=[SamplingParams(temperature=0.0, max_new_tokens=1)],
                prompt_ids=[ids],
                output_ids=[[]],
                return_logprob=False,
                top_logprobs_nums=[0],
            )
            runner.forward_stage(wb, self._proxies(wb))
        finally:
            runner.req_to_token_pool.free(row)

    def _proxies(self, wb: ModelWorkerBatch) -> Optional[PPProxyTensors]:
        if self.runner.is_first_stage:
            return None
        fb = self.runner.build_forward_batch(wb)  # under CP: how many tokens this rank holds
        local, _ = scatter_model_input(fb.input_ids, fb.positions, fb)
        shape = (local.shape[0], self.hidden)
        zeros = lambda: torch.zeros(shape, dtype=self.runner.dtype, device=self.runner.device)  # noqa: E731
        return PPProxyTensors({"hidden_states": zeros(), "residual": zeros()})


def shared_profile(runner: ModelRunner, groups: ParallelGroups, lengths: list[int]) -> list[float]:
    """This rank's prefill times, gathered over the world and merged (element-wise max)."""
    from sglang.srt.platforms import current_platform

    profiler = StagePrefillProfiler(runner)
    mine = time_prefills(profiler.run, lengths, current_platform().synchronize)
    every = groups.world.all_gather_object(mine) if groups.world.size > 1 else [mine]
    return merge_stage_latencies(every)


def build_dynamic_chunking(
    server_args: ServerArgs, runner: ModelRunner, groups: ParallelGroups
) -> Optional[ChunkPolicy]:
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
        len(lengths), min(lengths, default=0), max(lengths, default=0),
        "accepted" if fitted else "rejected (fixed chunks)" if server_args.dynamic_chunking_mode != "auto" else "no prior",
    )  # fmt: skip
    return policy
