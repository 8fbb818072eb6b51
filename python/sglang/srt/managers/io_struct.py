"""Every message that crosses a process boundary, in one module.

Flow:  HTTP / Engine --GenerateReqInput--> TokenizerManager
       TokenizerManager --TokenizedGenerateReqInput | AbortReq | FlushCacheReqInput | GetInternalStateReqInput
                        | ProfileReqInput--> Scheduler (entry rank; mirrored to every rank of its replica)
       Scheduler --BatchTokenIDOut--> DetokenizerManager --BatchStrOut--> TokenizerManager
       Scheduler --FlushCacheReqOutput | GetInternalStateReqOutput | ProfileReqOutput--> TokenizerManager (control replies)
       Scheduler watchdog thread --SchedulerHeartbeat--> TokenizerManager (every 0.5 s, even mid-forward)

All messages are plain dataclasses sent with `zmq.Socket.send_pyobj`.
`finished_reason` is None while a request runs, else a dict in SGLang's shape:
  {"type": "stop", "matched": <token id or stop string>} | {"type": "length", "length": n}
  | {"type": "abort", "message": "..."}
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from sglang.srt.sampling.sampling_params import SamplingParams


# ---------------------------------------------------------------------------- API layer
@dataclass
class GenerateReqInput:
    """One /generate call (single or batch), as SGLang's native API takes it."""

    text: Optional[Union[str, list[str]]] = None
    input_ids: Optional[Union[list[int], list[list[int]]]] = None
    sampling_params: Optional[Union[dict, list[dict]]] = None
    rid: Optional[Union[str, list[str]]] = None
    stream: bool = False
    return_logprob: Union[bool, list[bool]] = False
    top_logprobs_num: Union[int, list[int]] = 0
    logprob_start_len: Union[int, list[int]] = -1
    return_text_in_logprobs: bool = False
    # logprobs of these token ids at every prompt (from logprob_start_len) and output position:
    # one list for every prompt, or a list of lists for a batch
    token_ids_logprob: Optional[Union[list[int], list[list[int]]]] = None
    # PD disaggregation (set by sglang-router): where the prefill server's bootstrap server is and
    # the room pairing the prefill and decode halves of this request; lists for a batch.
    bootstrap_host: Optional[Union[str, list[str]]] = None
    bootstrap_port: Optional[Union[int, list[int]]] = None
    bootstrap_room: Optional[Union[int, list[int]]] = None
    log_metrics: bool = True  # upstream's field (sglang-router sends it); metrics are always on here

    @property
    def is_single(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, str)
        if self.input_ids is None:
            return True
        return len(self.input_ids) == 0 or not isinstance(self.input_ids[0], list)

    @property
    def batch_size(self) -> int:
        if self.is_single:
            return 1
        return len(self.text) if self.text is not None else len(self.input_ids)

    def __getitem__(self, i: int) -> "GenerateReqInput":
        """The i-th request of a batch as a single request (a single request returns itself)."""
        if self.is_single:
            return self

        def pick(value, default=None):
            return value[i] if isinstance(value, list) else (default if value is None else value)

        return GenerateReqInput(
            text=None if self.text is None else self.text[i],
            input_ids=None if self.input_ids is None else self.input_ids[i],
            sampling_params=pick(self.sampling_params, {}),
            rid=pick(self.rid) if isinstance(self.rid, list) else None,
            stream=self.stream,
            return_logprob=pick(self.return_logprob),
            top_logprobs_num=pick(self.top_logprobs_num),
            logprob_start_len=pick(self.logprob_start_len),
            return_text_in_logprobs=self.return_text_in_logprobs,
            token_ids_logprob=self._token_ids_logprob_of(i),
            bootstrap_host=pick(self.bootstrap_host),
            bootstrap_port=pick(self.bootstrap_port),
            bootstrap_room=pick(self.bootstrap_room),
        )

    def _token_ids_logprob_of(self, i: int) -> Optional[list[int]]:
        ids = self.token_ids_logprob
        if ids and isinstance(ids[0], list):
            return ids[i]
        return ids


def new_rid() -> str:
    return uuid.uuid4().hex


# ---------------------------------------------------------------------------- tokenizer -> scheduler
@dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_text: Optional[str]
    input_ids: list[int]
    sampling_params: SamplingParams
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1  # first prompt position with a logprob entry (-1: none)
    token_ids_logprob: Optional[list[int]] = None
    # PD disaggregation (None on a normal server)
    bootstrap_host: Optional[str] = None
    bootstrap_port: Optional[int] = None
    bootstrap_room: Optional[int] = None


@dataclass
class AbortReq:
    rid: str = ""
    abort_all: bool = False
    message: str = "aborted by client"


@dataclass
class FlushCacheReqInput:
    pass


@dataclass
class FlushCacheReqOutput:
    success: bool
    message: str = ""


@dataclass
class ClearHiCacheReqInput:
    """/clear_hicache_storage_backend: every rank deletes its L3 pages (its storage namespace)."""


@dataclass
class ClearHiCacheReqOutput(FlushCacheReqOutput):
    """A FlushCacheReqOutput, so the tokenizer side hands it to the oldest waiting flush-type call."""


@dataclass
class GetInternalStateReqInput:
    pass


@dataclass
class GetInternalStateReqOutput:
    state: dict[str, Any] = field(default_factory=dict)
    # With attention DP: each replica's own state (`state` is then their merge, see dp_controller)
    replica_states: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ProfileReqInput:
    """/start_profile and /stop_profile: torch.profiler on every scheduler rank. `start` with
    `num_steps` stops by itself after that many forward steps; traces go to `output_dir`."""

    action: str  # "start" | "stop"
    output_dir: str = "/tmp"
    num_steps: Optional[int] = None
    activities: tuple[str, ...] = ("CPU",)
    with_stack: bool = False
    record_shapes: bool = False
    profile_id: str = ""


@dataclass
class ProfileReqOutput:
    success: bool
    message: str = ""


@dataclass
class SchedulerHeartbeat:
    """Sent by the entry rank's watchdog thread (`managers/scheduler/scheduler_watchdog.py`) on its own,
    also while the scheduler loop is inside a long forward. Times are wall-clock (time.time())."""

    rank: int
    sent_time: float
    steps_finished: int  # forward steps (micro-batches) whose result was applied so far
    steps_in_flight: int
    busy_since: Optional[float]  # since when the loop waits for a step's result; None: no step running
    state: dict[str, Any]  # the loop's latest `Scheduler.internal_state()` snapshot
    state_time: float  # when that snapshot was taken
    watchdog_timeout: float
    dp_rank: int = 0  # attention DP: the replica whose entry rank sent it
    # attention DP: the controller's merged beat carries each replica's snapshot (`state` is their merge)
    replica_states: list[dict[str, Any]] = field(default_factory=list)


# ---------------------------------------------------------------------------- scheduler -> detokenizer
@dataclass
class BatchTokenIDOut:
    """New output tokens of the requests that progressed in one scheduler step.

    Lists are parallel, one entry per request. `new_output_ids` holds only the tokens produced
    since the previous message for that rid; logprob lists likewise hold only the new entries.
    """

    rids: list[str]
    new_output_ids: list[list[int]]
    finished_reasons: list[Optional[dict]]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    # Detokenization options of each request.
    skip_special_tokens: list[bool]
    spaces_between_special_tokens: list[bool]
    no_stop_trim: list[bool]
    stop_strs: list[list[str]]
    # Logprobs (None for a request that did not ask): lists of (logprob, token_id) and, per
    # position, a list of (logprob, token_id) of the top alternatives.
    output_token_logprobs: list[Optional[list[tuple[float, int]]]]
    output_top_logprobs: list[Optional[list[list[tuple[float, int]]]]]
    # A request's prompt logprobs, once, in the message where they are complete (else None), and
    # its token_ids_logprob entries of the new output tokens (None: not asked).
    input_logprobs: list[Optional["InputLogprobsOut"]] = field(default_factory=list)
    output_token_ids_logprobs: list[Optional[list]] = field(default_factory=list)


@dataclass
class InputLogprobsOut:
    """Prompt logprobs of one request from `logprob_start_len` on (managers/scheduler/prompt_logprobs.py):
    (logprob, token id) per prompt token, the first prompt token's logprob None; per position its
    top alternatives and its token_ids_logprob entries (None where not asked)."""

    token_logprobs: list[tuple[Optional[float], int]]
    top_logprobs: list[Optional[list[tuple[float, int]]]]
    token_ids_logprobs: list[Optional[list[tuple[float, int]]]]


# ---------------------------------------------------------------------------- detokenizer -> tokenizer
@dataclass
class BatchStrOut:
    """Incremental text for each rid: `output_strs[i]` is the new text since the last message."""

    rids: list[str]
    output_strs: list[str]
    new_output_ids: list[list[int]]
    finished_reasons: list[Optional[dict]]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    output_token_logprobs: list[Optional[list[tuple[float, int]]]]
    output_top_logprobs: list[Optional[list[list[tuple[float, int]]]]]
    input_logprobs: list[Optional[InputLogprobsOut]] = field(default_factory=list)
    output_token_ids_logprobs: list[Optional[list]] = field(default_factory=list)


# ---------------------------------------------------------------------------- process start-up
@dataclass
class SchedulerReadyInfo:
    """Sent by the scheduler (rank 0) over a multiprocessing pipe once its model and pools exist."""

    max_total_num_tokens: int
    max_req_input_len: int
    context_len: int
    vocab_size: int
    max_running_requests: int


# ---------------------------------------------------------------------------- attention DP
@dataclass
class DPLoadReport:
    """A replica's load, to the data-parallel controller (sent when it changes). `received` counts
    the generate requests the replica has taken so far, so the controller adds exactly the ones
    still on their way to it."""

    dp_rank: int
    num_reqs: int  # running + waiting
    num_tokens: int  # KV tokens in use + tokens of waiting prompts
    received: int


@dataclass
class DPReply:
    """A replica's control reply (flush, internal state), to the data-parallel controller."""

    dp_rank: int
    reply: Any


@dataclass
class DPWakeUp:
    """Controller -> a replica: another replica got work; stop blocking in the idle receive and
    join the next lockstep exchange at once."""
