"""Output assembly of the TokenizerManager: the detokenizer's `BatchStrOut` folded into the
requests' states, the SGLang-shaped result of a request
(`{"text", "output_ids", "meta_info": {...}}`, cumulative text and output ids), the streaming
update a consumer takes next, and the request metrics (TTFT, ITL, finished requests).
"""

from __future__ import annotations

import time
from typing import Any, Optional

from sglang.srt.managers.io_struct import BatchStrOut
from sglang.srt.managers.tokenizer.tokenizer_state import ReqChunk, ReqState, finish, notify
from sglang.srt.metrics.collector import ServerMetrics

TOKEN_TEXT_CACHE_MAX = 1 << 20


class OutputBuilder:
    """Builds results from request states; caches each token id's text for logprob entries."""

    def __init__(self, tokenizer: Optional[Any]):
        self.tokenizer = tokenizer
        self.token_text_cache: dict[int, str] = {}

    def token_text(self, tid: int) -> Optional[str]:
        if self.tokenizer is None:
            return None
        text = self.token_text_cache.get(tid)
        if text is None:
            text = self.tokenizer.decode([tid])
            if len(self.token_text_cache) < TOKEN_TEXT_CACHE_MAX:
                self.token_text_cache[tid] = text
        return text

    def _logprob_entries(self, pairs: list, with_text: bool) -> list:
        return [(lp, tid, self.token_text(tid) if with_text else None) for lp, tid in pairs]

    def _per_position(self, lists: list, with_text: bool) -> list:
        """Per position, its (logprob, id) alternatives as entries (None stays None: position 0)."""
        return [None if pairs is None else self._logprob_entries(pairs, with_text) for pairs in lists]

    def _logprob_meta(self, state: ReqState) -> dict[str, Any]:
        """upstream's logprob fields of meta_info: input_* from logprob_start_len on (empty when it
        is -1), output_* for the generated tokens; *_token_ids_logprobs only with token_ids_logprob."""
        with_text = state.req.return_text_in_logprobs
        inp = state.input_logprobs
        meta: dict[str, Any] = {
            "input_token_logprobs": self._logprob_entries(inp.token_logprobs if inp else [], with_text),
            "input_top_logprobs": self._per_position(inp.top_logprobs if inp else [], with_text),
            "output_token_logprobs": self._logprob_entries(state.output_token_logprobs, with_text),
            "output_top_logprobs": self._per_position(state.output_top_logprobs, with_text),
        }
        if state.req.token_ids_logprob is not None:
            meta["input_token_ids_logprobs"] = self._per_position(
                inp.token_ids_logprobs if inp else [], with_text
            )
            meta["output_token_ids_logprobs"] = self._per_position(state.output_token_ids_logprobs, with_text)
        return meta

    def build_output(self, state: ReqState) -> dict:
        """The SGLang-shaped dict of a request so far (cumulative text and output ids)."""
        end = state.finished_time if state.finished_time is not None else time.time()
        meta: dict[str, Any] = {
            "id": state.req.rid,
            "prompt_tokens": state.prompt_tokens or len(state.req.input_ids),
            "completion_tokens": state.completion_tokens,
            "cached_tokens": state.cached_tokens,
            "finish_reason": state.finished_reason,
            "e2e_latency": end - state.created_time,
        }
        if state.req.return_logprob:
            meta.update(self._logprob_meta(state))
        return {"text": state.text, "output_ids": list(state.output_ids), "meta_info": meta}

    def take_chunk(self, state: ReqState) -> Optional[ReqChunk]:
        """What is new in `state` since the last chunk (None when nothing is), marked as taken."""
        new_text = state.text[state.yielded_text :]
        new_ids = state.output_ids[state.yielded_ids :]
        if not new_text and not new_ids and not state.finished:
            return None
        chunk = ReqChunk(
            index=state.req.index,
            rid=state.req.rid,
            out=self.build_output(state),
            delta_text=new_text,
            delta_output_ids=new_ids,
            logprob_start=state.yielded_logprobs,
            finished=state.finished,
        )
        state.yielded_text = len(state.text)
        state.yielded_ids = len(state.output_ids)
        state.yielded_logprobs = len(state.output_token_logprobs)
        state.yielded_finished = state.finished
        return chunk


class RequestMetricsRecorder:
    """Per-request figures into `ServerMetrics` (health probes are not counted).

    TTFT at the first message with tokens, ITL spread over the tokens of each later one.
    Streaming or not, the scheduler reports a request's first token on its own
    (`scheduler_output.due_for_output`), so TTFT is exact for every request; a non-streaming
    request's remaining tokens arrive with its final message and share its gap evenly.
    """

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics

    def on_tokens(self, state: ReqState, num_new: int, now: float) -> None:
        if state.is_health_probe or num_new <= 0:
            return
        if state.first_token_time is None:
            state.first_token_time = now
            self.metrics.observe_ttft(now - state.created_time)
        else:
            self.metrics.observe_itl(now - state.last_token_time, num_new)
        state.last_token_time = now

    def on_finish(self, state: ReqState) -> None:
        if state.is_health_probe:
            return
        reason = state.finished_reason or {}
        self.metrics.observe_finish(
            prompt_tokens=state.prompt_tokens or len(state.req.input_ids),
            completion_tokens=state.completion_tokens,
            cached_tokens=state.cached_tokens,
            e2e_s=(state.finished_time or time.time()) - state.created_time,
            aborted=reason.get("type") == "abort",
        )


def apply_batch_str(
    out: BatchStrOut,
    rid_to_state: dict[str, ReqState],
    recorder: Optional[RequestMetricsRecorder],
) -> None:
    """Fold one detokenizer message into the states of its requests; a finished request leaves
    `rid_to_state` and its consumer is woken either way."""
    now = time.time()
    for i, rid in enumerate(out.rids):
        state = rid_to_state.get(rid)
        if state is None:
            continue
        if recorder is not None:
            recorder.on_tokens(state, len(out.new_output_ids[i]), now)
        state.text += out.output_strs[i]
        state.output_ids.extend(out.new_output_ids[i])
        state.prompt_tokens = out.prompt_tokens[i]
        state.completion_tokens = out.completion_tokens[i]
        state.cached_tokens = out.cached_tokens[i]
        if state.req.return_logprob:
            state.output_token_logprobs.extend(out.output_token_logprobs[i] or [])
            state.output_top_logprobs.extend(out.output_top_logprobs[i] or [])
            if i < len(out.output_token_ids_logprobs):
                state.output_token_ids_logprobs.extend(out.output_token_ids_logprobs[i] or [])
            if i < len(out.input_logprobs) and out.input_logprobs[i] is not None:
                state.input_logprobs = out.input_logprobs[i]
        if out.finished_reasons[i] is None:
            notify(state)
            continue
        finish(state, out.finished_reasons[i])
        del rid_to_state[rid]
        if recorder is not None:
            recorder.on_finish(state)
