"""The first token's handoff from the prefill side to the decode side: what `FirstToken` carries
besides the token itself (its logprobs, and the prompt logprobs only the prefill side computes,
managers/scheduler/prompt_logprobs.py) and how the decode side's request takes them over."""

from __future__ import annotations

from typing import Optional

from sglang.srt.disaggregation.base.messages import FirstToken
from sglang.srt.managers.scheduler.schedule_batch import Req


def first_token_of(req: Req, logprob: Optional[float], top: Optional[list]) -> FirstToken:
    """Prefill side: the request's sampled first token with everything the decode side returns."""
    first = FirstToken(req.output_ids[-1], logprob, top)
    if req.token_ids_logprob is not None and req.output_token_ids_logprobs:
        first.token_ids_logprobs = req.output_token_ids_logprobs[-1]
    lp = req.prompt_logprobs
    if lp is not None:
        first.input_token_logprobs = list(lp.token_logprobs)
        first.input_top_logprobs = list(lp.top_logprobs)
        first.input_token_ids_logprobs = list(lp.token_ids_logprobs)
    return first


def land_logprobs(req: Req, first: FirstToken) -> None:
    """Decode side: the first token's logprobs and the prefill side's prompt logprobs, as if this
    server had computed them (the first token itself is already appended)."""
    if req.return_logprob and first.logprob is not None:
        req.output_token_logprobs.append((first.logprob, int(first.token_id)))
        if req.top_logprobs_num:
            req.output_top_logprobs.append(list(first.top_logprobs or []))
        if req.token_ids_logprob is not None:
            req.output_token_ids_logprobs.append(list(first.token_ids_logprobs or []))
    lp = req.prompt_logprobs
    if lp is not None and first.input_token_logprobs is not None:
        lp.token_logprobs = list(first.input_token_logprobs)
        lp.top_logprobs = list(first.input_top_logprobs or [])
        lp.token_ids_logprobs = list(first.input_token_ids_logprobs or [])
