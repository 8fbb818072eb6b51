"""Req and ScheduleBatch: CPU-side request state owned by the scheduler (no tensors of its own).

A request's tokens are `fill_ids = origin_input_ids + output_ids`. `kv_len` counts the leading
tokens whose KV is stored (row `req_pool_idx` of req_to_token, positions 0..kv_len-1). Every
forward step takes the next tokens `fill_ids[kv_len : kv_len + n]` of each scheduled request:
n = 1 for a decode, up to the chunk budget for a prefill. A request samples a token only in the
step that brings it level with `fill_ids` ("caught up").
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from sglang.srt.managers.scheduler.prompt_logprobs import PromptLogprobs
from sglang.srt.model_executor.worker_batch import ModelWorkerBatch
from sglang.srt.sampling.sampling_params import SamplingParams

STOP_REGEX_WINDOW = 64  # output tokens a stop_regex match is looked for in (each step)


class Req:
    def __init__(
        self,
        rid: str,
        origin_input_ids: list[int],
        sampling_params: SamplingParams,
        stream: bool = False,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        input_text: Optional[str] = None,
        logprob_start_len: int = -1,
        token_ids_logprob: Optional[list[int]] = None,
    ):
        self.rid = rid
        self.input_text = input_text
        self.origin_input_ids = list(origin_input_ids)
        self.output_ids: list[int] = []
        self.sampling_params = sampling_params
        self.stream = stream
        self.return_logprob = return_logprob
        self.top_logprobs_num = top_logprobs_num
        self.token_ids_logprob = list(token_ids_logprob) if return_logprob and token_ids_logprob else None
        # prompt logprobs (managers/scheduler/prompt_logprobs.py); None: not asked
        self.prompt_logprobs: Optional[PromptLogprobs] = None
        if return_logprob and logprob_start_len >= 0:
            self.prompt_logprobs = PromptLogprobs.create(
                self.origin_input_ids, logprob_start_len, top_logprobs_num, self.token_ids_logprob
            )
        self.arrival_time = time.monotonic()

        # Memory state.
        self.req_pool_idx: Optional[int] = None
        self.kv_len = 0  # tokens of fill_ids whose KV is in the pool (or being written in flight)
        self.in_flight = False  # a step that will sample this request's next token is running
        self.cached_prefix_len = 0  # tokens locked from the radix cache (for dedup on insert)
        self.last_node: Any = None  # radix node locked by this request
        self.cached_tokens = 0  # prompt tokens served from the radix cache (reported)

        # Output state.
        self.finished_reason: Optional[dict] = None
        self.sent_len = 0  # output tokens already sent to the detokenizer
        self.output_token_logprobs: list[tuple[float, int]] = []
        self.output_top_logprobs: list[list[tuple[float, int]]] = []
        self.output_token_ids_logprobs: list[list[tuple[float, int]]] = []
        self.retracted_count = 0
        self.queued_s: Optional[float] = None  # arrival to its first step (queue_time metric)

    # ------------------------------------------------------------------ token views
    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """`fill_ids[start:end]` without building fill_ids (a decode step takes one output token)."""
        n_in = len(self.origin_input_ids)
        if start >= n_in:
            return self.output_ids[start - n_in : end - n_in]
        if end <= n_in:
            return self.origin_input_ids[start:end]
        return self.origin_input_ids[start:] + self.output_ids[: end - n_in]

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def remaining_len(self) -> int:
        """Tokens still to run through the model before this request can sample."""
        return self.seqlen - self.kv_len

    @property
    def is_prefilling(self) -> bool:
        return self.remaining_len > 1 or not self.output_ids

    @property
    def schedulable(self) -> bool:
        """Not waiting for a sampled token and still has tokens to run."""
        return not self.in_flight and self.remaining_len >= 1

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    # ------------------------------------------------------------------ sampling
    def append_token(
        self,
        token: int,
        logprob: Optional[float] = None,
        top: Optional[list] = None,
        ids: Optional[list] = None,
    ) -> None:
        """A sampled token, with its logprob, top logprobs and token-ids logprobs when the request
        returns them."""
        self.output_ids.append(token)
        if logprob is not None:
            self.output_token_logprobs.append((logprob, token))
            if top is not None:
                self.output_top_logprobs.append(top)
            if ids is not None:
                self.output_token_ids_logprobs.append(ids)

    # ------------------------------------------------------------------ finishing
    def check_finished(self, eos_token_ids: set[int], tokenizer=None, context_len: int = 0) -> None:
        """Set finished_reason after a token was appended (SGLang's rules and reason shapes)."""
        if self.finished:
            return
        params = self.sampling_params
        last = self.output_ids[-1]
        if len(self.output_ids) >= params.min_new_tokens:
            if params.stop_token_ids and last in params.stop_token_ids:
                self.finished_reason = {"type": "stop", "matched": last}
                return
            if not params.ignore_eos and last in eos_token_ids:
                self.finished_reason = {"type": "stop", "matched": last}
                return
            if params.stop and tokenizer is not None:
                matched = self._match_stop_str(tokenizer)
                if matched is not None:
                    self.finished_reason = {"type": "stop", "matched": matched}
                    return
            if params.stop_regex and tokenizer is not None:
                matched = self._match_stop_regex(tokenizer)
                if matched is not None:
                    self.finished_reason = {"type": "stop", "matched": matched}
                    return
        if len(self.output_ids) >= params.max_new_tokens:
            self.finished_reason = {"type": "length", "length": params.max_new_tokens}
        elif context_len and self.seqlen >= context_len:
            self.finished_reason = {"type": "length", "length": len(self.output_ids)}

    def _match_stop_str(self, tokenizer) -> Optional[str]:
        params = self.sampling_params
        window = getattr(params, "stop_str_max_len", 0) or max(len(s) for s in params.stop)
        tail_ids = self.output_ids[-(window + 2) :]
        tail = tokenizer.decode(tail_ids, skip_special_tokens=params.skip_special_tokens)
        for stop in params.stop:
            if stop and stop in tail:
                return stop
        return None

    def _match_stop_regex(self, tokenizer) -> Optional[str]:
        """The text a `stop_regex` pattern matches in the decoded output's last STOP_REGEX_WINDOW
        tokens (the detokenizer trims the output there, as for a stop string)."""
        params = self.sampling_params
        tail = tokenizer.decode(
            self.output_ids[-STOP_REGEX_WINDOW:], skip_special_tokens=params.skip_special_tokens
        )
        for pattern in params.stop_regex:
            m = re.search(pattern, tail)
            if m is not None and m.group(0):
                return m.group(0)
        return None

    def reset_memory_state(self) -> None:
        self.in_flight = False
        self.req_pool_idx = None
        self.kv_len = 0
        self.cached_prefix_len = 0
        self.last_node = None

    def __repr__(self) -> str:
        return f"Req(rid={self.rid}, prompt={len(self.origin_input_ids)}, out={len(self.output_ids)}, kv={self.kv_len})"


@dataclass
class ScheduledReq:
    """One request's share of a forward step: `num_tokens` tokens starting at `kv_len`."""

    req: Req
    start: int
    num_tokens: int
    # this step's prompt-logprob rows of the request: positions [lp_first, lp_first + lp_count)
    lp_first: int = 0
    lp_count: int = 0

    @property
    def samples(self) -> bool:
        return self.start + self.num_tokens == self.req.seqlen


@dataclass
class ScheduleBatch:
    """The work of one forward step: decodes first, then prefill chunks."""

    items: list[ScheduledReq] = field(default_factory=list)

    @property
    def reqs(self) -> list[Req]:
        return [item.req for item in self.items]

    @property
    def num_tokens(self) -> int:
        return sum(item.num_tokens for item in self.items)

    @property
    def is_empty(self) -> bool:
        return not self.items

    @property
    def is_decode_only(self) -> bool:
        return all(item.num_tokens == 1 and item.req.output_ids for item in self.items)

    def has_prefill_items(self) -> bool:
        return any(item.req.is_prefilling for item in self.items)

    def to_worker_batch(self, out_cache_loc) -> ModelWorkerBatch:
        input_ids: list[int] = []
        positions: list[int] = []
        for item in self.items:
            input_ids.extend(item.req.token_slice(item.start, item.start + item.num_tokens))
            positions.extend(range(item.start, item.start + item.num_tokens))
        sampling = [item for item in self.items if item.samples]
        return ModelWorkerBatch(
            input_ids=input_ids,
            positions=positions,
            out_cache_loc=out_cache_loc,
            req_pool_indices=[item.req.req_pool_idx for item in self.items],
            prefix_lens=[item.start for item in self.items],
            extend_lens=[item.num_tokens for item in self.items],
            is_decode=self.is_decode_only,
            sample_rows=[i for i, item in enumerate(self.items) if item.samples],
            sampling_params=[item.req.sampling_params for item in sampling],
            prompt_ids=[item.req.origin_input_ids for item in sampling],
            output_ids=[item.req.output_ids for item in sampling],
            return_logprob=any(item.req.return_logprob for item in sampling),
            top_logprobs_nums=[
                item.req.top_logprobs_num if item.req.return_logprob else 0 for item in sampling
            ],
            token_ids_logprob=[item.req.token_ids_logprob for item in sampling],
            **self._logprob_rows(),
        )

    def _logprob_rows(self) -> dict:
        """The step's prompt-logprob rows (flat token indices), the token each predicts, and per row the
        request's top-k size and token ids; records each item's share (`lp_first`, `lp_count`)."""
        rows: list[int] = []
        targets: list[int] = []
        top_nums: list[int] = []
        token_ids: list[Optional[list[int]]] = []
        offset = 0
        for item in self.items:
            lp = item.req.prompt_logprobs
            if lp is not None:
                first, count = lp.rows(item.start, item.num_tokens)
                item.lp_first, item.lp_count = first, count
                rows.extend(range(offset + first - item.start, offset + first - item.start + count))
                targets.extend(lp.prompt[first + 1 : first + 1 + count])
                top_nums.extend([lp.top_num] * count)
                token_ids.extend([lp.token_ids] * count)
            offset += item.num_tokens
        return dict(
            logprob_rows=rows, logprob_targets=targets, logprob_top_nums=top_nums, logprob_token_ids=token_ids
        )
