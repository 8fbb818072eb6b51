"""A step's logprobs applied to its requests: each request's share of the prompt-logprob rows
(prompt_logprobs.py) and the logprobs of a sampled token."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler.schedule_batch import Req, ScheduleBatch
    from sglang.srt.model_executor.model_runner import ForwardResult


def apply_step(batch: "ScheduleBatch", result: "ForwardResult") -> None:
    """Hand each request its share of the step's prompt-logprob rows."""
    got = result.input_logprobs
    if got is None:
        return
    at = 0
    for item in batch.items:
        if not item.lp_count:
            continue
        end = at + item.lp_count
        lp = item.req.prompt_logprobs
        if lp is not None and not item.req.finished:
            lp.add(item.lp_first, got.values[at:end], got.top[at:end], got.token_ids[at:end])
        at = end


def sampled_logprobs(req: "Req", result: "ForwardResult", row: int) -> tuple:
    """(logprob, top logprobs, token-ids logprobs) of the token sampled for `req` in row `row`;
    None for what the request did not ask."""
    if not req.return_logprob:
        return None, None, None
    lp = result.logprobs[row] if result.logprobs is not None else None
    top = result.top_logprobs[row] if req.top_logprobs_num and result.top_logprobs is not None else None
    ids = None
    if req.token_ids_logprob is not None and result.token_ids_logprobs is not None:
        ids = result.token_ids_logprobs[row]
    return lp, top, ids
