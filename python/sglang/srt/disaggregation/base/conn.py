"""The transfer backend's classes, as the prefill / decode components use them.

A `KVBackend` (one value of --disaggregation-transfer-backend) builds one KV manager per rank
from `KVManagerArgs`: a `BasePrefillKVManager` hands out a `BaseKVSender` per request (room), a
`BaseDecodeKVManager` a `BaseKVReceiver`. The scheduler thread only calls the sender's / receiver's
methods and reads `poll()`; a backend's own threads advance its `TransferState` (kv_poll.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from sglang.srt import envs
from sglang.srt.disaggregation.base.bootstrap import BaseBootstrapClient
from sglang.srt.disaggregation.base.kv_poll import KVPoll
from sglang.srt.disaggregation.base.messages import FirstToken
from sglang.srt.mem_cache.transfer_layout import KVRegion

# Called on a backend thread with a room whose KV every decode rank confirmed.
SuccessCallback = Callable[[int], None]


@dataclass(frozen=True)
class RankPlace:
    """This rank's coordinates (explicit parallel state)."""

    tp_rank: int = 0
    tp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    dp_rank: int = 0
    dp_size: int = 1

    @property
    def is_entry(self) -> bool:
        return self.tp_rank == 0 and self.pp_rank == 0 and self.cp_rank == 0


@dataclass(frozen=True)
class Timeouts:
    """The SGLANG_DISAGGREGATION_* timeouts of a backend with peers."""

    bootstrap_s: float
    waiting_s: float
    heartbeat_s: float
    heartbeat_max_failure: int

    @staticmethod
    def from_env() -> "Timeouts":
        return Timeouts(
            envs.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.get(),
            envs.SGLANG_DISAGGREGATION_WAITING_TIMEOUT.get(),
            envs.SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL.get(),
            envs.SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE.get(),
        )

    @property
    def dead_after_s(self) -> float:
        return self.heartbeat_s * (self.heartbeat_max_failure + 1)


@dataclass(frozen=True)
class KVManagerArgs:
    """Everything a backend builds one rank's KV manager from."""

    place: RankPlace
    ip: str  # the address peers reach this rank on
    regions: list[KVRegion]  # this rank's KV buffers (mem_cache/transfer_layout.py)
    kv_dtype: str
    page_size: int
    kv_kind: str  # "mha" | "mla" | "dsa"
    start_layer: int
    end_layer: int
    ib_device: Optional[str]  # --disaggregation-ib-device (RDMA NICs; None: TCP)
    bootstrap: BaseBootstrapClient
    bootstrap_url: str  # prefill side: this server's bootstrap server ("" on the decode side)


class BaseKVSender(ABC):
    """One request (`room`) on one prefill rank."""

    room: int

    @property
    @abstractmethod
    def transfers_kv(self) -> bool:
        """Whether KV really moves to a peer for this room (False: the fake backend's state
        machine only). Only such rooms are sent by later pipeline stages or confirmed early."""

    @abstractmethod
    def poll(self) -> KVPoll:
        """The transfer's state (applies the bootstrap / waiting timeouts)."""

    @abstractmethod
    def send(self, positions: np.ndarray, src_slots: np.ndarray) -> None:
        """Hand over the KV of token `positions` (stored in this rank's `src_slots`)."""

    @abstractmethod
    def finish(self, first_token: Optional[FirstToken]) -> None:
        """The last chunk was handed over (and, on the entry rank, the first token sampled)."""

    @abstractmethod
    def abort(self, reason: str) -> None:
        """Fail the room here and tell the peers."""

    @abstractmethod
    def failure_exception(self) -> Optional[str]:
        """Why the room failed (None: it did not)."""

    @abstractmethod
    def transfer_metric(self) -> dict:
        """The room's transfer record for internal_state (room, bytes, per-chunk records)."""

    @abstractmethod
    def release(self) -> None:
        """The scheduler is done with the room (its KV is freed): the manager forgets it."""


class BaseKVReceiver(ABC):
    """One request (`room`) on one decode rank."""

    room: int
    first_token: Optional[FirstToken]  # set once the entry prefill rank's report arrived

    @property
    @abstractmethod
    def transfers_kv(self) -> bool:
        """Whether KV really comes from a peer for this room (False: the fake backend)."""

    @abstractmethod
    def init(self) -> None:
        """Start looking the prefill ranks up (Bootstrapping -> WaitingForInput when known)."""

    @abstractmethod
    def poll(self) -> KVPoll:
        """The transfer's state (applies the bootstrap / waiting timeouts)."""

    @abstractmethod
    def send_metadata(self, dst_slots: np.ndarray, row: int = -1) -> None:
        """Tell every prefill rank where this rank's KV of the prompt goes (and, with decode
        pipeline stages, where the later stages' ranks keep it: the same slots of their pools, the
        request's `row` of their req_to_token mirrors)."""

    @abstractmethod
    def abort(self, reason: str) -> None:
        """Fail the room here and tell the peers."""

    @abstractmethod
    def failure_exception(self) -> Optional[str]:
        """Why the room failed (None: it did not)."""

    @property
    @abstractmethod
    def drained(self) -> bool:
        """No prefill rank can still write into this rank's slots of the room."""

    @abstractmethod
    def release(self) -> None:
        """The scheduler is done with the room: the manager forgets it."""


class BaseKVManager(ABC):
    """One rank's transfer manager (its threads, sockets and registered memory)."""

    @abstractmethod
    def start(self) -> None:
        """Start the threads (and, on the prefill side, register at the bootstrap server)."""

    @abstractmethod
    def close(self) -> None: ...


class BasePrefillKVManager(BaseKVManager):
    @abstractmethod
    def create_sender(self, room: int) -> BaseKVSender:
        """ValueError when `room` is already in use on this rank."""

    @abstractmethod
    def set_success_callback(self, callback: SuccessCallback) -> None:
        """Call `callback(room)` (on a backend thread) the moment a room's KV is confirmed."""


class BaseDecodeKVManager(BaseKVManager):
    @abstractmethod
    def create_receiver(self, room: int, bootstrap_url: str) -> BaseKVReceiver:
        """ValueError when `room` is already in use on this rank."""

    # Decode pipeline stages (--pp-size > 1): stage 0's rank asks the same tp rank of every later
    # stage to receive that stage's layers; a backend without peers ignores all three.
    def stage_address(self) -> Optional[str]:
        """How stage 0's rank reaches this rank (None: nothing to reach)."""
        return None

    def set_later_stages(self, addresses: list[Optional[str]]) -> None:
        """(stage 0) The `stage_address` of this tp rank on stages 1, 2, ..."""

    def set_row_writer(self, writer: Callable[[int, np.ndarray], None]) -> None:
        """(stage k > 0) `writer(row, slots)` mirrors a received prompt's slots into this stage's
        req_to_token row before any KV can arrive."""


class KVBackend(ABC):
    """One value of --disaggregation-transfer-backend: builds a rank's KV manager."""

    @property
    @abstractmethod
    def moves_kv(self) -> bool:
        """False when no data moves (the fake backend): nothing to register, no later-stage sends."""

    @abstractmethod
    def prefill_manager(self, args: KVManagerArgs) -> BasePrefillKVManager:
        """A started prefill-side manager."""

    @abstractmethod
    def decode_manager(self, args: KVManagerArgs) -> BaseDecodeKVManager:
        """A started decode-side manager."""
