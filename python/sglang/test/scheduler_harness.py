"""Drive an in-process Scheduler (no ZMQ, no subprocess) and compare against HF transformers.

Used by parity tests: the scheduler runs its real policy, cache and runner; outputs are collected
from the BatchTokenIDOut messages it would send to the detokenizer, and the float32 logits of every
sampled row (`ForwardResult.logits`) are captured per request through the `on_step_result`
observer the harness gives the `Scheduler`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import torch

from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs


class SchedulerHarness:
    def __init__(self, **server_kwargs):
        server_kwargs.setdefault("dtype", "float32")
        server_kwargs.setdefault("num_threads", 1)
        self.server_args = ServerArgs(**server_kwargs)
        self.server_args.validate()
        self.scheduler = Scheduler(self.server_args, on_step_result=self._on_step)
        self.logits: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.outputs: dict[str, list[int]] = defaultdict(list)
        self.finish: dict[str, dict] = {}
        self.cached: dict[str, int] = {}
        self.batch_shapes: list[tuple[int, int]] = []  # (num requests, num tokens) per step
        self._n = 0

    def _on_step(self, batch, result) -> None:
        self.batch_shapes.append((len(batch.items), batch.num_tokens))
        rows = [item.req.rid for item in batch.items if item.samples]
        for i, rid in enumerate(rows):  # `result.logits` is the runner's tensor: keep a copy
            self.logits[rid].append(result.logits[i].clone())

    def submit(
        self, input_ids: list[int], max_new_tokens: int = 16, rid: Optional[str] = None, **params
    ) -> str:
        rid = rid or f"req{self._n}"
        self._n += 1
        sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, **params)
        self.scheduler.handle_message(TokenizedGenerateReqInput(rid, None, list(input_ids), sp))
        return rid

    def abort(self, rid: str) -> None:
        self.scheduler.handle_message(AbortReq(rid=rid))

    def step(self) -> None:
        self._collect(self.scheduler.step())

    def run(self, max_steps: int = 10_000) -> None:
        for out in self.scheduler.run_until_idle(max_steps):
            self._collect(out)

    def _collect(self, out) -> None:
        if out is None:
            return
        for i, rid in enumerate(out.rids):
            self.outputs[rid].extend(out.new_output_ids[i])
            self.cached[rid] = out.cached_tokens[i]
            if out.finished_reasons[i] is not None:
                self.finish[rid] = out.finished_reasons[i]


def hf_greedy(model, input_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """Reference greedy decoding with full recomputation (tiny models only): ids and logits."""
    ids = list(input_ids)
    out, logits = [], []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            step_logits = model(torch.tensor([ids])).logits[0, -1].float()
            token = int(torch.argmax(step_logits))
            logits.append(step_logits)
            out.append(token)
            ids.append(token)
    return out, logits
