"""The fake backend: the state machine without peers or data (upstream's semantics).

Sender: WaitingForInput until its first `send` / `finish`, then Success. Receiver: Bootstrapping
until `init`, WaitingForInput until `send_metadata`, then Success. `abort` fails either. Used for
`--disaggregation-transfer-backend fake`, for requests whose bootstrap host is
FAKE_BOOTSTRAP_HOST (warm-up, /health_generate) and for state-machine tests. No KV moves: a
decode server fed by it generates from whatever its slots hold, and its first token is 0.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from sglang.srt.disaggregation.base.conn import (
    BaseDecodeKVManager,
    BaseKVReceiver,
    BaseKVSender,
    BasePrefillKVManager,
    KVBackend,
    KVManagerArgs,
    SuccessCallback,
)
from sglang.srt.disaggregation.base.kv_poll import KVPoll, TransferState
from sglang.srt.disaggregation.base.messages import FirstToken


class FakeKVSender(BaseKVSender):
    def __init__(self, room: int):
        self.room = room
        self.state = TransferState(room, KVPoll.WaitingForInput)
        self.records: list = []
        self.nbytes = 0

    @property
    def transfers_kv(self) -> bool:
        return False

    def poll(self) -> KVPoll:
        return self.state.poll()

    def send(self, positions: np.ndarray, src_slots: np.ndarray) -> None:
        self.state.advance_to_at_least(KVPoll.Success)

    def finish(self, first_token: Optional[FirstToken]) -> None:
        self.state.advance_to_at_least(KVPoll.Success)

    def abort(self, reason: str = "aborted") -> None:
        self.state.fail(reason)

    def failure_exception(self) -> Optional[str]:
        return self.state.reason

    def transfer_metric(self) -> dict:
        return {"room": self.room, "bytes": 0, "chunks": []}

    def release(self) -> None:
        """Nothing is held for the room."""


class FakeKVReceiver(BaseKVReceiver):
    def __init__(self, room: int):
        self.room = room
        self.state = TransferState(room)
        self.first_token: Optional[FirstToken] = None
        self.initialized = False

    @property
    def transfers_kv(self) -> bool:
        return False

    def init(self) -> None:
        self.initialized = True
        self.state.advance(KVPoll.WaitingForInput)

    def poll(self) -> KVPoll:
        return self.state.poll()

    def send_metadata(self, dst_slots: np.ndarray, row: int = -1) -> None:
        if self.state.poll() == KVPoll.Bootstrapping:
            raise RuntimeError("send_metadata before init")
        self.first_token = FirstToken(0)
        self.state.advance(KVPoll.Success)

    def abort(self, reason: str = "aborted") -> None:
        self.state.fail(reason)

    def failure_exception(self) -> Optional[str]:
        return self.state.reason

    @property
    def drained(self) -> bool:
        return True

    def release(self) -> None:
        """Nothing is held for the room."""


class FakePrefillKVManager(BasePrefillKVManager):
    """No threads, no peers: every room gets a `FakeKVSender` (never confirmed early)."""

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def create_sender(self, room: int) -> FakeKVSender:
        return FakeKVSender(room)

    def set_success_callback(self, callback: SuccessCallback) -> None:
        """Fake rooms succeed at the scheduler's next poll: no early confirmation."""


class FakeDecodeKVManager(BaseDecodeKVManager):
    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def create_receiver(self, room: int, bootstrap_url: str) -> FakeKVReceiver:
        return FakeKVReceiver(room)


class FakeBackend(KVBackend):
    @property
    def moves_kv(self) -> bool:
        return False

    def prefill_manager(self, args: Optional[KVManagerArgs] = None) -> FakePrefillKVManager:
        return FakePrefillKVManager()

    def decode_manager(self, args: Optional[KVManagerArgs] = None) -> FakeDecodeKVManager:
        return FakeDecodeKVManager()
