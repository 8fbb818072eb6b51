"""The PD component a scheduler holds: one interface, called at fixed points of the scheduler's
step, with three implementations picked once by `factory.create_disaggregation`:
`PrefillDisaggregation` (prefill.py), `DecodeDisaggregation` (decode.py) and
`NullDisaggregation` (a normal server: every hook does nothing).

The scheduler's points, in the order a request meets them:
  admit           a new request: held in the component's queues, or refused (missing fields);
  step            every loop iteration on every rank: requests move from the component's queues
                  to the scheduler's waiting / running lists, or finish here;
  after_forward   a step's forward ran: its new KV starts moving (prefill side);
  take_over       a request sampled its first token: the peer continues it (prefill side);
  abort_queued /  an abort: of the requests in the component's queues / of one the scheduler
  on_abort        holds (its transfer fails too);
  on_requeue      the scheduler retracted a request and will prefill it again;
  busy, internal_state, rooms_of, set_output_sink: the loop's idle test, /get_server_info, the
                  pipeline driver's rooms for later stages, the entry rank's early answers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from sglang.srt.managers.io_struct import BatchTokenIDOut, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler.schedule_batch import Req, ScheduleBatch

OutputSink = Callable[[BatchTokenIDOut], None]


@dataclass(frozen=True)
class Admission:
    """What `admit` did with a new request."""

    held: bool = False  # in the component's queues until `step` hands it to the scheduler
    error: Optional[str] = None  # refused: the client gets this message (HTTP 400)


TO_SCHEDULER = Admission()  # not the component's: the scheduler's waiting list takes it
HELD = Admission(held=True)


@dataclass(frozen=True)
class Moves:
    """What one `step` of the component hands to the scheduler."""

    to_waiting: Sequence[Req] = ()  # ready to prefill
    to_running: Sequence[Req] = ()  # KV and first token here: decode from now on (or finished)
    finished: Sequence[Req] = ()  # done or failed in the component (KV released, reason set)


NO_MOVES = Moves()


class Disaggregation(ABC):
    @abstractmethod
    def admit(self, req: Req, recv: TokenizedGenerateReqInput) -> Admission: ...

    @abstractmethod
    def step(self, running: list[Req]) -> Moves:
        """`running`: the scheduler's running requests (the decode side leaves room for them)."""

    @abstractmethod
    def after_forward(self, batch: ScheduleBatch) -> None: ...

    @abstractmethod
    def take_over(self, req: Req, logprob: Optional[float], top: Optional[list]) -> bool:
        """True when the component took the request over (it leaves the scheduler's `running`)."""

    @abstractmethod
    def abort_queued(self, rid: str, abort_all: bool, message: str) -> list[Req]:
        """Abort requests in the component's queues; returns them, reason set, KV released."""

    @abstractmethod
    def on_abort(self, req: Req, message: str) -> None:
        """The scheduler aborted `req` (waiting / running)."""

    @abstractmethod
    def on_requeue(self, req: Req) -> None: ...

    @property
    @abstractmethod
    def busy(self) -> bool:
        """Requests in the component's queues (the loop must keep stepping)."""

    @abstractmethod
    def internal_state(self) -> dict: ...

    @abstractmethod
    def rooms_of(self, batch: ScheduleBatch) -> list[Optional[int]]:
        """The bootstrap room of each item whose KV later pipeline stages send ([] when none)."""

    @abstractmethod
    def set_output_sink(self, sink: OutputSink) -> None:
        """Entry rank: where a request may be answered from a transfer thread."""


class NullDisaggregation(Disaggregation):
    """A normal (colocated) server: every hook does nothing."""

    def admit(self, req, recv) -> Admission:
        return TO_SCHEDULER

    def step(self, running) -> Moves:
        return NO_MOVES

    def after_forward(self, batch) -> None:
        pass

    def take_over(self, req, logprob, top) -> bool:
        return False

    def abort_queued(self, rid, abort_all, message) -> list:
        return []

    def on_abort(self, req, message) -> None:
        pass

    def on_requeue(self, req) -> None:
        pass

    @property
    def busy(self) -> bool:
        return False

    def internal_state(self) -> dict:
        return {}

    def rooms_of(self, batch) -> list:
        return []

    def set_output_sink(self, sink) -> None:
        pass
