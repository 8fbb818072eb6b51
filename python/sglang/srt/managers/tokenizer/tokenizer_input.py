"""Validate, tokenize and expand a `GenerateReqInput` into per-request scheduler messages.

Everything a user can get wrong is caught here and raised as a `ValueError` with a clear message
(the HTTP layer turns it into a 400). `n > 1` expands one prompt into n requests with distinct
rids (and seeds `seed + i` when a seed is given).
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, fields
from typing import Any, Optional

from sglang.srt.managers.io_struct import GenerateReqInput, SchedulerReadyInfo, new_rid
from sglang.srt.constrained.grammar_spec import spec_of
from sglang.srt.sampling.sampling_params import SamplingParams

MAX_TOP_LOGPROBS = 1024


@dataclass
class PreparedReq:
    """One request ready for the scheduler, with its position in the caller's batch."""

    index: int
    rid: str
    input_text: Optional[str]
    input_ids: list[int]
    sampling_params: SamplingParams
    stream: bool
    return_logprob: bool
    top_logprobs_num: int
    return_text_in_logprobs: bool
    logprob_start_len: int = -1
    token_ids_logprob: Optional[list[int]] = None


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def generate_req_from_dict(body: Any) -> GenerateReqInput:
    """Build a GenerateReqInput from JSON; unknown keys are ignored only when their value is empty."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    known = {f.name for f in fields(GenerateReqInput)}
    unknown = [k for k, v in body.items() if k not in known and v not in (None, False, [], {}, "")]
    if unknown:
        raise ValueError(f"unsupported request field(s): {', '.join(sorted(unknown))}")
    return GenerateReqInput(**{k: v for k, v in body.items() if k in known})


def check_generate_req(obj: GenerateReqInput) -> None:
    """Type checks of the batch-level fields (before indexing into the batch)."""
    if obj.text is None and obj.input_ids is None:
        raise ValueError("either 'text' or 'input_ids' must be provided")
    if obj.text is not None and obj.input_ids is not None:
        raise ValueError("provide only one of 'text' and 'input_ids'")
    if obj.text is not None:
        if isinstance(obj.text, list):
            if not obj.text:
                raise ValueError("'text' must not be an empty list")
            if not all(isinstance(t, str) for t in obj.text):
                raise ValueError("'text' must be a string or a list of strings")
        elif not isinstance(obj.text, str):
            raise ValueError("'text' must be a string or a list of strings")
    if obj.input_ids is not None:
        ids = obj.input_ids
        if not isinstance(ids, list):
            raise ValueError("'input_ids' must be a list of token ids or a list of such lists")
        if ids and isinstance(ids[0], list):
            if not all(isinstance(x, list) and all(_is_int(t) for t in x) for x in ids):
                raise ValueError("'input_ids' must be a list of token ids or a list of such lists")
        elif not all(_is_int(t) for t in ids):
            raise ValueError("'input_ids' must be a list of integer token ids")
    if not isinstance(obj.stream, bool):
        raise ValueError("'stream' must be a boolean")
    n = obj.batch_size
    for name in ("sampling_params", "rid", "return_logprob", "top_logprobs_num", "logprob_start_len"):
        value = getattr(obj, name)
        if isinstance(value, list) and not obj.is_single and len(value) != n:
            raise ValueError(f"'{name}' has {len(value)} entries but the batch has {n} prompts")
    if isinstance(obj.sampling_params, list) and obj.is_single:
        raise ValueError("'sampling_params' must be an object for a single prompt")


def _check_one(req: GenerateReqInput) -> None:
    if req.rid is not None and not isinstance(req.rid, str):
        raise ValueError("'rid' must be a string")
    if not isinstance(req.return_logprob, bool):
        raise ValueError("'return_logprob' must be a boolean")
    if not _is_int(req.top_logprobs_num) or not 0 <= req.top_logprobs_num <= MAX_TOP_LOGPROBS:
        raise ValueError(f"'top_logprobs_num' must be an integer in [0, {MAX_TOP_LOGPROBS}]")
    if not _is_int(req.logprob_start_len) or req.logprob_start_len < -1:
        raise ValueError("'logprob_start_len' must be an integer >= -1")
    ids = req.token_ids_logprob
    if ids is not None and not (isinstance(ids, list) and all(_is_int(t) for t in ids)):
        raise ValueError("'token_ids_logprob' must be a list of token ids (or one such list per prompt)")


def _check_logprob_fields(req: GenerateReqInput, input_ids: list[int], info: SchedulerReadyInfo) -> None:
    """logprob_start_len within the prompt, token_ids_logprob within the vocabulary (as upstream)."""
    if req.return_logprob and req.logprob_start_len >= len(input_ids):
        raise ValueError(
            f"logprob_start_len ({req.logprob_start_len}) must be smaller than the prompt's "
            f"{len(input_ids)} tokens"
        )
    for tid in req.token_ids_logprob or []:
        if not 0 <= tid < info.vocab_size:
            raise ValueError(
                f"token_ids_logprob entry {tid} is outside the vocabulary [0, {info.vocab_size})"
            )


def tokenize_prompt(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.encode(text)
    return list(getattr(ids, "ids", ids))


def check_input_ids(input_ids: list[int], info: SchedulerReadyInfo) -> None:
    """Empty prompt, token ids outside the vocabulary, prompt too long for the context or for the
    KV cache pool (the message names the limit)."""
    if not input_ids:
        raise ValueError("the prompt is empty")
    for tid in input_ids:
        if tid < 0 or tid >= info.vocab_size:
            raise ValueError(f"token id {tid} is outside the vocabulary [0, {info.vocab_size})")
    n = len(input_ids)
    if n > info.context_len - 1:
        raise ValueError(
            f"the prompt has {n} tokens, more than this model's maximum input length of "
            f"{info.context_len - 1} tokens (context length {info.context_len})"
        )
    if n > info.max_req_input_len:
        raise ValueError(
            f"the prompt has {n} tokens, more than the KV cache pool can hold for one request: "
            f"{info.max_total_num_tokens} tokens in all (--max-total-tokens / memory budget)"
        )


def parse_sampling_params(
    raw: Optional[dict], input_len: int, info: SchedulerReadyInfo, tokenizer: Any, clamp: bool = False
) -> SamplingParams:
    """User dict -> verified, normalized SamplingParams fitted into the context window.

    `max_new_tokens` given: the prompt and it must fit the context and the KV pool. Given as null
    (what /v1/chat/completions sends without `max_tokens`): to EOS or the context / KV pool limit,
    as upstream. Absent: SGLang's 128, clamped to that limit. `clamp` (`--allow-auto-truncate`):
    a given one is clamped to that limit too instead of refused."""
    params = SamplingParams.from_dict(raw)
    params.verify(info.vocab_size)
    spec_of(params)  # more than one constraint: 400 here; an invalid one: the scheduler's 400
    params.normalize(tokenizer)
    raw = raw if isinstance(raw, dict) else {}
    if raw.get("max_new_tokens") is not None and not clamp:
        total = input_len + params.max_new_tokens
        if total > info.context_len:
            raise ValueError(
                f"this model's maximum context length is {info.context_len} tokens, but "
                f"{total} were requested ({input_len} in the prompt "
                f"and {params.max_new_tokens} for the completion); reduce the prompt or max_new_tokens"
            )
        if total > info.max_total_num_tokens:
            raise ValueError(
                f"this request needs up to {total} tokens of KV cache ({input_len} in the prompt and "
                f"{params.max_new_tokens} for the completion), more than the KV cache pool's "
                f"{info.max_total_num_tokens} tokens (--max-total-tokens / memory budget); "
                "reduce the prompt or max_new_tokens"
            )
        return params
    # The default budget must also fit the KV pool, or the scheduler would abort the request.
    room = max(min(info.context_len, info.max_total_num_tokens) - input_len, 0)
    if "max_new_tokens" in raw or params.max_new_tokens > room:
        params.max_new_tokens = room
        params.min_new_tokens = min(params.min_new_tokens, params.max_new_tokens)
    return params


def fit_prompt(input_ids: list[int], info: SchedulerReadyInfo, auto_truncate: bool) -> list[int]:
    """`--allow-auto-truncate`: a prompt over the model's input limit keeps its last tokens (as
    upstream, cut from the left); otherwise it is returned as is (and refused by check_input_ids)."""
    limit = min(info.context_len - 1, info.max_req_input_len)
    if auto_truncate and len(input_ids) > limit:
        return input_ids[len(input_ids) - limit :]
    return input_ids


def prepare_requests(
    obj: GenerateReqInput,
    tokenizer: Optional[Any],
    info: SchedulerReadyInfo,
    rids_in_use: Optional[set[str]] = None,
    auto_truncate: bool = False,
) -> list[PreparedReq]:
    """Validate and tokenize every prompt of `obj`; expand n > 1 (`auto_truncate`:
    `--allow-auto-truncate`). Raises ValueError on bad input."""
    check_generate_req(obj)
    rids_in_use = rids_in_use or set()
    out: list[PreparedReq] = []
    seen: set[str] = set()
    for i in range(obj.batch_size):
        req = obj[i]
        _check_one(req)
        if req.text is not None:
            if req.text == "":
                raise ValueError("the prompt is empty")
            if tokenizer is None:
                raise ValueError("text prompts need a tokenizer (server started with --skip-tokenizer-init)")
            input_ids = tokenize_prompt(tokenizer, req.text)
        else:
            input_ids = [int(t) for t in req.input_ids]
        input_ids = fit_prompt(input_ids, info, auto_truncate)
        check_input_ids(input_ids, info)
        _check_logprob_fields(req, input_ids, info)
        raw = req.sampling_params if req.sampling_params is not None else {}
        params = parse_sampling_params(raw, len(input_ids), info, tokenizer, auto_truncate)
        base_rid = req.rid if req.rid is not None else new_rid()
        n = params.n
        for j in range(n):
            rid = base_rid if n == 1 else f"{base_rid}-{j}"
            if rid in rids_in_use or rid in seen:
                raise ValueError(f"duplicate request id {rid!r}")
            seen.add(rid)
            sub = dataclasses.replace(params, n=1)
            if n > 1 and params.seed is not None:
                sub.seed = params.seed + j
            out.append(
                PreparedReq(
                    index=len(out),
                    rid=rid,
                    input_text=req.text,
                    input_ids=list(input_ids),
                    sampling_params=sub,
                    stream=obj.stream,
                    return_logprob=req.return_logprob,
                    top_logprobs_num=req.top_logprobs_num,
                    return_text_in_logprobs=obj.return_text_in_logprobs,
                    logprob_start_len=req.logprob_start_len if req.return_logprob else -1,
                    token_ids_logprob=list(req.token_ids_logprob) if req.token_ids_logprob else None,
                )
            )
    return out
