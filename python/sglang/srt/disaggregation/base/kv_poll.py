"""KVPoll: the state of one request's KV transfer, and the state machine both sides share.

Values and names are upstream's (`Failed` is 0 so that the MIN over ranks of a tensor of polls is
the state every rank may act on: any failure wins, Success only when all succeeded).

    Bootstrapping --> WaitingForInput --> Transferring --> Success
          |                 |                  |             |
          +-----------------+---------- Failed <-------------+ (abort only)

Prefill sender: Bootstrapping until the decode side's KV addresses arrived (every decode rank's),
WaitingForInput until the first chunk is handed over, Transferring until the decode side confirms
it holds all the KV, then Success. Decode receiver: Bootstrapping until the prefill ranks are
known, WaitingForInput once its KV slots are sent, Transferring when the first chunk lands,
Success when every prefill rank reported its part (and the first token). `abort()` and errors
lead to Failed from any state; Failed is final.
"""

from __future__ import annotations

import threading
import time
from enum import IntEnum
from typing import Optional


class KVPoll(IntEnum):
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


_ALLOWED: dict[KVPoll, set[KVPoll]] = {
    KVPoll.Bootstrapping: {KVPoll.WaitingForInput, KVPoll.Failed},
    KVPoll.WaitingForInput: {KVPoll.Transferring, KVPoll.Success, KVPoll.Failed},
    KVPoll.Transferring: {KVPoll.Success, KVPoll.Failed},
    KVPoll.Success: {KVPoll.Failed},  # an abort after success (the client left) still fails it
    KVPoll.Failed: set(),
}


class IllegalTransition(RuntimeError):
    pass


class TransferState:
    """Thread-safe KVPoll with transition checks, the time of every state reached and the first
    failure's reason. Transfer threads advance it; the scheduler only reads it (`poll`)."""

    def __init__(self, room: int, state: KVPoll = KVPoll.Bootstrapping):
        self.room = room
        self._state = state
        self._lock = threading.Lock()
        self.reason: Optional[str] = None
        self.times: dict[KVPoll, float] = {state: time.monotonic()}

    def poll(self) -> KVPoll:
        return self._state

    def advance(self, to: KVPoll) -> bool:
        """Move forward to `to`; False (nothing changes) when already there or Failed (a late
        event of a failed transfer is ignored). IllegalTransition when `to` is not reachable
        (going back, skipping the handshake)."""
        with self._lock:
            if to == self._state or self._state == KVPoll.Failed:
                return False
            if to not in _ALLOWED[self._state]:
                raise IllegalTransition(f"room {self.room}: {self._state.name} -> {to.name}")
            self._state = to
            self.times[to] = time.monotonic()
            return True

    def advance_to_at_least(self, to: KVPoll) -> None:
        """Step through the states before `to` as needed (Bootstrapping -> ... -> to); no-op if
        already there or further, or failed."""
        for state in (KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success):
            if state > to:
                break
            with self._lock:
                current = self._state
            if current == KVPoll.Failed or current >= state:
                continue
            self.advance(state)

    def fail(self, reason: str) -> bool:
        """Move to Failed (from any state) keeping the first reason; False if already Failed."""
        with self._lock:
            if self._state == KVPoll.Failed:
                return False
            self._state = KVPoll.Failed
            self.reason = reason
            self.times[KVPoll.Failed] = time.monotonic()
            return True

    def age_in(self, state: KVPoll) -> float:
        """Seconds since `state` was entered (0 if never)."""
        t = self.times.get(state)
        return 0.0 if t is None else time.monotonic() - t

    def __repr__(self) -> str:
        return f"TransferState(room={self.room}, {self._state.name})"
