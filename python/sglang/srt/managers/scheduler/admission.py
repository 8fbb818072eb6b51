"""Request admission: a tokenized request becomes a `Req`, or is refused with the HTTP status the
tokenizer manager answers with (`finished_reason["status_code"]`).

- 400: the prompt does not fit the model (empty, longer than `max_req_input_len`, token ids
  outside the vocabulary);
- 503: the overload guard (issue 19): `--max-queued-requests` requests already wait.

PD's own check (the bootstrap fields, `Disaggregation.admit`) comes after these, in the scheduler.
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler.schedule_batch import Req

Refusal = tuple[str, int]  # (message for the client, HTTP status)


class RequestAdmission:
    """`tokenizer`: normalizes the sampling parameters (stop strings); None with
    `--skip-tokenizer-init`. `max_queued_requests`: None for an unbounded waiting queue."""

    def __init__(
        self, tokenizer, max_req_input_len: int, vocab_size: int, max_queued_requests: Optional[int]
    ):
        self.tokenizer = tokenizer
        self.max_req_input_len = max_req_input_len
        self.vocab_size = vocab_size
        self.max_queued_requests = max_queued_requests

    def new_req(self, recv: TokenizedGenerateReqInput) -> Req:
        params = recv.sampling_params
        params.normalize(self.tokenizer)
        return Req(
            recv.rid,
            recv.input_ids,
            params,
            stream=recv.stream,
            return_logprob=recv.return_logprob,
            top_logprobs_num=recv.top_logprobs_num,
            input_text=recv.input_text,
            logprob_start_len=recv.logprob_start_len,
            token_ids_logprob=recv.token_ids_logprob,
        )

    def refusal(self, req: Req, num_waiting: int) -> Optional[Refusal]:
        """Why `req` may not wait to be scheduled behind `num_waiting` others; None: it may."""
        error = self._invalid(req)
        if error is not None:
            return error, 400
        limit = self.max_queued_requests
        if limit is not None and num_waiting >= limit:
            message = (
                f"the server is overloaded: {num_waiting} requests are already waiting to be scheduled "
                f"(--max-queued-requests {limit}); retry later"
            )
            return message, 503
        return None

    def _invalid(self, req: Req) -> Optional[str]:
        n = len(req.origin_input_ids)
        if n == 0:
            return "the prompt is empty"
        if n > self.max_req_input_len:
            return f"the prompt has {n} tokens, more than the maximum of {self.max_req_input_len}"
        if min(req.origin_input_ids) < 0 or max(req.origin_input_ids) >= self.vocab_size:
            return f"input token ids must be in [0, {self.vocab_size})"
        return None


def refuse(req: Req, refusal: Refusal) -> None:
    """Finish `req` as refused; `status_code`: the tokenizer manager turns it into that HTTP status."""
    message, status = refusal
    req.finished_reason = {"type": "abort", "message": message, "status_code": status}
