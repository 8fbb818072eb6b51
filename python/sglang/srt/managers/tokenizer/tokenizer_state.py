"""The TokenizerManager's per-request state: what a running request has produced so far, the call
that groups the requests of one generate call, the streaming update handed to a consumer, and the
two errors the request path raises (HTTP 503 / the scheduler's own refusal status).

Owned by the TokenizerManager's event loop: the receive side fills a `ReqState` and queues its
index on the call (`notify`), the consumer waits on that queue (`next_index`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Optional

from sglang.srt.managers.io_struct import GenerateReqInput, InputLogprobsOut
from sglang.srt.managers.tokenizer.tokenizer_input import PreparedReq

DISCONNECT_POLL_S = 1.0  # a waiting consumer checks this often whether its client left
HEALTH_RID_PREFIX = "HEALTH_CHECK_"  # health probes: not counted in the metrics


class SchedulerUnavailable(RuntimeError):
    """The scheduler's state cannot be told right now (HTTP 503)."""


class RequestRejected(RuntimeError):
    """The scheduler refused a request before it produced anything: `status` is the HTTP status
    to answer with (400: it cannot fit; 503: --max-queued-requests reached)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass
class ReqState:
    """Accumulated output of one running request (owned by the TokenizerManager's loop)."""

    req: PreparedReq
    call: "GenerateCall"
    created_time: float = field(default_factory=time.time)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finished_reason: Optional[dict] = None
    finished: bool = False
    finished_time: Optional[float] = None
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    output_token_ids_logprobs: list = field(default_factory=list)
    input_logprobs: Optional[InputLogprobsOut] = None  # prompt logprobs, once complete
    error: Optional[str] = None  # set when the engine died under this request
    # Arrival times of the first and the latest output tokens (metrics).
    first_token_time: Optional[float] = None
    last_token_time: Optional[float] = None
    # How much has been handed to the consumer already.
    yielded_text: int = 0
    yielded_ids: int = 0
    yielded_logprobs: int = 0
    yielded_finished: bool = False

    @property
    def is_health_probe(self) -> bool:
        return self.req.rid.startswith(HEALTH_RID_PREFIX)


@dataclass
class GenerateCall:
    """All requests of one generate call and the queue that tells which of them progressed."""

    obj: GenerateReqInput
    reqs: list[PreparedReq]
    states: list[ReqState] = field(default_factory=list)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    # One batch entry expands to several requests when n > 1 (the result is then a list).
    is_single: bool = True


@dataclass
class ReqChunk:
    """One streaming update of one request: the SGLang dict plus what is new in it."""

    index: int
    rid: str
    out: dict
    delta_text: str
    delta_output_ids: list[int]
    logprob_start: int  # first new entry of output_token_logprobs / output_top_logprobs
    finished: bool


def notify(state: ReqState) -> None:
    """Tell the consumer of the request's call that the request progressed."""
    state.event.set()
    state.call.queue.put_nowait(state.req.index)


def finish(state: ReqState, reason: dict) -> None:
    state.finished = True
    state.finished_reason = reason
    state.finished_time = time.time()
    notify(state)


async def next_index(queue: asyncio.Queue) -> int:
    """The next progressed index of a call; asyncio.TimeoutError after DISCONNECT_POLL_S.

    Hot path of streaming (once per request per step): a ready item is taken without awaiting,
    and waiting uses `asyncio.timeout` (no extra Task per item, unlike `wait_for` before 3.12).
    """
    if not queue.empty():
        return queue.get_nowait()
    if _TIMEOUT is None:  # Python < 3.11
        return await asyncio.wait_for(queue.get(), timeout=DISCONNECT_POLL_S)
    async with _TIMEOUT(DISCONNECT_POLL_S):
        return await queue.get()


_TIMEOUT = getattr(asyncio, "timeout", None)


def raise_if_rejected(state: ReqState) -> None:
    """RequestRejected when the scheduler refused the request outright (an abort with an HTTP
    status before any output), so that the caller answers with that status, not a 200."""
    reason = state.finished_reason or {}
    if not (state.finished and reason.get("type") == "abort" and reason.get("status_code")):
        return
    if not state.output_ids and not state.yielded_finished:
        raise RequestRejected(str(reason.get("message", "rejected")), int(reason["status_code"]))
