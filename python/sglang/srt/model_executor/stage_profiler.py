"""Time a prefill of n tokens on this pipeline stage (dynamic chunking's start-up profile).

`StagePrefillProfiler(runner).run(n)` runs one single-request prefill of `n` tokens through the
runner's own layers, writing KV into slots no request holds yet (the profile runs before any
request exists). Stage 0 embeds real token ids; later stages get zero activations of the shape
the previous stage would send (under CP: this rank's share of the tokens). The batch is built the
way the scheduler builds every batch (`ScheduleBatch.to_worker_batch`). The policy built from
the timings is `managers/scheduler/chunk_profiler.py`'s job.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.communicator import scatter_model_input
from sglang.srt.managers.scheduler.schedule_batch import Req, ScheduleBatch, ScheduledReq
from sglang.srt.model_executor.forward_batch import PPProxyTensors
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_executor.worker_batch import ModelWorkerBatch
from sglang.srt.sampling.sampling_params import SamplingParams


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
        pool = runner.req_to_token_pool
        rows = pool.alloc(1)
        if rows is None:
            raise RuntimeError("dynamic-chunking profiling: no free request row")
        row = rows[0]
        try:
            slots = torch.arange(runner.kv_page_size, runner.kv_page_size + n, dtype=torch.int64)
            pool.req_to_token[row, :n] = slots.to(pool.req_to_token.device)
            wb = self._prefill_batch(row, n, slots)
            runner.forward_stage(wb, self._proxies(wb))
        finally:
            pool.free(row)

    def _prefill_batch(self, row: int, n: int, slots: torch.Tensor) -> ModelWorkerBatch:
        """One request of `n` deterministic token ids in request row `row`, greedy, one sampled row."""
        req = Req(
            "stage-profile",
            [(i * 7919 + 13) % self.vocab for i in range(n)],
            SamplingParams(temperature=0.0, max_new_tokens=1),
        )
        req.req_pool_idx = row
        return ScheduleBatch([ScheduledReq(req, 0, n)]).to_worker_batch(slots)

    def _proxies(self, wb: ModelWorkerBatch) -> Optional[PPProxyTensors]:
        if self.runner.is_first_stage:
            return None
        fb = self.runner.build_forward_batch(wb)  # under CP: how many tokens this rank holds
        local, _ = scatter_model_input(fb.input_ids, fb.positions, fb)
        shape = (local.shape[0], self.hidden)
        zeros = lambda: torch.zeros(shape, dtype=self.runner.dtype, device=self.runner.device)  # noqa: E731
        return PPProxyTensors({"hidden_states": zeros(), "residual": zeros()})
