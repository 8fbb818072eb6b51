"""Logprobs the model runner computes from logits it already has: the prompt logprobs of a step's
`logprob_rows` (`input_logprobs`) and the logprobs of given token ids (`token_ids_logprob`).

Like the sampler's output logprobs they are `log_softmax` of the raw float32 logits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang.srt.model_executor.worker_batch import ModelWorkerBatch

Pair = tuple[float, int]


@dataclass
class InputLogprobs:
    """One entry per `ModelWorkerBatch.logprob_rows` row, in that order."""

    values: list[float]  # logprob of the token the row predicts
    top: list[list[Pair]]  # the row's top-k (its request's top_logprobs_num; [] for 0)
    token_ids: list[Optional[list[Pair]]]  # its request's token_ids_logprob (None: not asked)


def token_ids_logprobs(logprobs: torch.Tensor, ids: list[Optional[list[int]]]) -> list[Optional[list[Pair]]]:
    """Per row, (logprob, id) of each id in `ids[row]` (None where not asked)."""
    out: list[Optional[list[Pair]]] = []
    for row, wanted in enumerate(ids):
        if wanted is None:
            out.append(None)
            continue
        index = torch.tensor(wanted, dtype=torch.int64, device=logprobs.device)
        out.append(list(zip(logprobs[row].index_select(0, index).tolist(), wanted)))
    return out


def top_k_logprobs(logprobs: torch.Tensor, nums: list[int]) -> list[list[Pair]]:
    """Per row, its `nums[row]` most likely (logprob, id), descending."""
    k = min(max(nums, default=0), logprobs.shape[-1])
    if k <= 0:
        return [[] for _ in nums]
    vals, ids = torch.topk(logprobs, k, dim=-1, sorted=True)
    vals_l, ids_l = vals.tolist(), ids.tolist()
    return [list(zip(vals_l[i][:n], ids_l[i][:n])) for i, n in enumerate(nums)]


def input_logprobs(logits: torch.Tensor, wb: ModelWorkerBatch) -> InputLogprobs:
    """The prompt logprobs of `wb.logprob_rows` from their logits ([rows, vocab])."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.tensor(wb.logprob_targets, dtype=torch.int64, device=logprobs.device)
    values = logprobs.gather(1, targets.view(-1, 1)).view(-1).tolist()
    return InputLogprobs(
        values=values,
        top=top_k_logprobs(logprobs, wb.logprob_top_nums),
        token_ids=token_ids_logprobs(logprobs, wb.logprob_token_ids),
    )
