"""The KVPoll state machine and the fake backend's sender / receiver (no network)."""

from __future__ import annotations

import numpy as np
import pytest

from sglang.srt.disaggregation.fake.conn import FakeKVReceiver, FakeKVSender
from sglang.srt.disaggregation.base.kv_poll import IllegalTransition, KVPoll, TransferState


def test_values_order_failure_first():
    # MIN over ranks must pick Failed, and Success only when all succeeded
    assert [int(p) for p in KVPoll] == [0, 1, 2, 3, 4]
    assert min(KVPoll.Success, KVPoll.Failed, KVPoll.Transferring) == KVPoll.Failed


def test_forward_path_and_times():
    s = TransferState(7)
    assert s.poll() == KVPoll.Bootstrapping
    assert s.advance(KVPoll.WaitingForInput) and s.advance(KVPoll.Transferring) and s.advance(KVPoll.Success)
    assert s.poll() == KVPoll.Success
    assert set(s.times) == {KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success}
    assert not s.advance(KVPoll.Success)  # same state: no-op


@pytest.mark.parametrize(
    "start,to",
    [
        (KVPoll.Bootstrapping, KVPoll.Transferring),  # skipping the handshake
        (KVPoll.Bootstrapping, KVPoll.Success),
        (KVPoll.Transferring, KVPoll.WaitingForInput),  # going back
        (KVPoll.Success, KVPoll.Transferring),
    ],
)
def test_illegal_transitions(start, to):
    s = TransferState(1, start)
    with pytest.raises(IllegalTransition):
        s.advance(to)


@pytest.mark.parametrize("state", list(KVPoll))
def test_fail_from_every_state_is_final(state):
    s = TransferState(3, state)
    first = s.fail("boom")
    assert s.poll() == KVPoll.Failed
    assert first == (state != KVPoll.Failed)
    assert not s.fail("again")
    if state != KVPoll.Failed:
        assert s.reason == "boom"
    assert not s.advance(KVPoll.Success)  # a late event of a failed transfer is ignored
    assert s.poll() == KVPoll.Failed


def test_advance_to_at_least_steps_through():
    s = TransferState(1, KVPoll.WaitingForInput)
    s.advance_to_at_least(KVPoll.Success)
    assert s.poll() == KVPoll.Success and KVPoll.Transferring in s.times
    f = TransferState(2)
    f.fail("x")
    f.advance_to_at_least(KVPoll.Success)
    assert f.poll() == KVPoll.Failed


def test_fake_sender_semantics():
    s = FakeKVSender(5)
    assert s.poll() == KVPoll.WaitingForInput
    s.send(np.arange(4), np.arange(4))
    assert s.poll() == KVPoll.Success
    s.finish(None)
    assert s.poll() == KVPoll.Success


def test_fake_receiver_semantics():
    r = FakeKVReceiver(5)
    assert r.poll() == KVPoll.Bootstrapping
    with pytest.raises(RuntimeError):
        r.send_metadata(np.arange(3))
    r.init()
    assert r.poll() == KVPoll.WaitingForInput
    r.send_metadata(np.arange(3))
    assert r.poll() == KVPoll.Success and r.first_token.token_id == 0 and r.drained


@pytest.mark.parametrize("steps", [0, 1, 2])
def test_fake_abort_in_every_state(steps):
    r = FakeKVReceiver(9)
    if steps >= 1:
        r.init()
    if steps >= 2:
        r.send_metadata(np.arange(2))
    r.abort("client left")
    assert r.poll() == KVPoll.Failed and r.failure_exception() == "client left"
    s = FakeKVSender(9)
    if steps >= 1:
        s.send(np.arange(1), np.arange(1))
    s.abort("client left")
    assert s.poll() == KVPoll.Failed
