"""Jump-forward on the scheduler side (`--enable-jump-forward`, docs/structured_outputs.md).

After a constrained request's sampled token is appended, the grammar manager may replace that
token by it + the text the grammar forces (retokenized, `constrained/jump_forward.py`). The new
tokens are appended to the output and the request is then `fill_ids` ahead of its KV, so the next
step extends it over its existing KV (a chunk, as a chunked prefill continues) and samples after
the last forced token: no decode step per forced token.

Each appended token goes through the finish checks (`max_new_tokens`, stop tokens / strings /
regex, the context length): the jump is cut at the first token that finishes the request and the
matcher rolled back over the rest. Jumped tokens are counted in `completion_tokens` and streamed
like sampled ones. Their logprob (`return_logprob`) is 0.0 (probability 1: the grammar allowed
nothing else; the model did not score them), top logprobs the forced token alone, and
`token_ids_logprob` 0.0 for the forced id and None for the others.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.managers.scheduler.schedule_batch import Req

JUMP_CONTEXT = 8  # written tokens decoded before the sampled one, to retokenize the boundary


def jump_forward(sched: Any, req: Req) -> None:
    """Append the text `req`'s grammar forces after its just-sampled token. `sched`: the Scheduler
    (its grammar manager, EOS ids, tokenizer and context length)."""
    grammar = sched.grammar
    if not grammar.jump_forward_enabled or req.finished or req.kv_len != req.seqlen - 1:
        return
    limit = req.sampling_params.max_new_tokens - len(req.output_ids)
    if sched.context_len:
        limit = min(limit, sched.context_len - req.seqlen)
    if limit <= 0:
        return
    end = req.seqlen - 1
    new = grammar.jump_forward(req, req.token_slice(max(0, end - JUMP_CONTEXT), end), limit)
    if new is None:
        return
    scored = req.return_logprob and len(req.output_token_logprobs) == len(req.output_ids)
    sampled = req.output_ids.pop()
    keep = new[0] == sampled  # the sampled token stays, with its logprobs
    if not keep and scored:
        _drop_last_logprobs(req)
    for i, token in enumerate(new):
        if i == 0 and keep:
            req.output_ids.append(token)
            continue
        req.append_token(token, *_forced_logprobs(req, token))
        req.check_finished(sched.eos_token_ids, sched.tokenizer, sched.context_len)
        if req.finished:
            grammar.rollback(req, len(new) - 1 - i)
            return


def _forced_logprobs(req: Req, token: int) -> tuple:
    if not req.return_logprob:
        return None, None, None
    top = [(0.0, token)] if req.top_logprobs_num else None
    ids = None
    if req.token_ids_logprob is not None:
        ids = [(0.0 if t == token else None, t) for t in req.token_ids_logprob]
    return 0.0, top, ids


def _drop_last_logprobs(req: Req) -> None:
    """The sampled token was merged with the forced text: its logprob entries go with it."""
    req.output_token_logprobs.pop()
    if req.top_logprobs_num and req.output_top_logprobs:
        req.output_top_logprobs.pop()
    if req.token_ids_logprob is not None and req.output_token_ids_logprobs:
        req.output_token_ids_logprobs.pop()
