"""The PD component the scheduler holds: the factory picks one implementation once (a normal
server's does nothing), every transfer backend implements the base classes, the fake backend's
rooms say they move no KV, the request side's role answers from the flags, and managers/ names no
PD mode."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sglang.srt.disaggregation.base.conn import (
    BaseDecodeKVManager,
    BaseKVReceiver,
    BaseKVSender,
    BasePrefillKVManager,
    KVBackend,
)
from sglang.srt.disaggregation.base.kv_poll import KVPoll
from sglang.srt.disaggregation.component import TO_SCHEDULER, Disaggregation, NullDisaggregation
from sglang.srt.disaggregation.factory import BACKENDS, create_disaggregation, create_stage_transfer
from sglang.srt.disaggregation.fake.conn import FakeBackend
from sglang.srt.disaggregation.mooncake.decode_conn import MooncakeDecodeKVManager, MooncakeKVReceiver
from sglang.srt.disaggregation.mooncake.prefill_conn import MooncakeKVSender, MooncakePrefillKVManager
from sglang.srt.disaggregation.role import DisaggregationRole
from sglang.srt.managers.scheduler.schedule_batch import ScheduleBatch

MANAGERS = Path(__file__).resolve().parents[2] / "python" / "sglang" / "srt" / "managers"


def _args(mode: str, backend: str = "fake") -> SimpleNamespace:
    return SimpleNamespace(disaggregation_mode=mode, disaggregation_transfer_backend=backend)


def test_null_mode_builds_the_null_component_without_touching_the_rank():
    comp = create_disaggregation(_args("null", "mooncake"), groups=None, runner=None, cache=None)
    assert isinstance(comp, NullDisaggregation) and isinstance(comp, Disaggregation)
    assert comp.admit(None, None) is TO_SCHEDULER
    moves = comp.step([])
    assert not (moves.to_waiting or moves.to_running or moves.finished)
    assert not comp.busy and comp.internal_state() == {}
    assert comp.abort_queued("r", True, "x") == [] and not comp.take_over(None, None, None)
    assert comp.rooms_of(ScheduleBatch()) == []


@pytest.mark.parametrize(
    "args", [_args("null", "mooncake"), _args("decode", "fake"), _args("prefill", "fake")]
)
def test_no_stage_transfer_unless_a_pd_server_moves_kv(args):
    """Later pipeline stages send (prefill) or receive (decode, test_pd_heterogeneous.py's decode
    pp 2) their layers' KV only with a backend that moves KV."""
    assert create_stage_transfer(args, groups=None, runner=None) is None


def test_every_backend_implements_the_base_classes():
    assert set(BACKENDS) == {"mooncake", "fake"}  # the --disaggregation-transfer-backend choices
    for backend in BACKENDS.values():
        assert issubclass(backend, KVBackend) and not inspect.isabstract(backend)
    for cls, base in [
        (MooncakeKVSender, BaseKVSender),
        (MooncakeKVReceiver, BaseKVReceiver),
        (MooncakePrefillKVManager, BasePrefillKVManager),
        (MooncakeDecodeKVManager, BaseDecodeKVManager),
    ]:
        assert issubclass(cls, base) and not inspect.isabstract(cls), cls
    assert BACKENDS["mooncake"]().moves_kv and not BACKENDS["fake"]().moves_kv


def test_fake_managers_hand_out_rooms_that_move_no_kv():
    backend = FakeBackend()
    sender = backend.prefill_manager().create_sender(7)
    receiver = backend.decode_manager().create_receiver(7, "http://unused:1")
    assert isinstance(sender, BaseKVSender) and isinstance(receiver, BaseKVReceiver)
    assert not sender.transfers_kv and not receiver.transfers_kv
    sender.send(np.arange(2), np.arange(2))
    receiver.init()
    receiver.send_metadata(np.arange(2))
    assert sender.poll() == receiver.poll() == KVPoll.Success
    sender.release()
    receiver.release()


def test_managers_name_no_pd_mode():
    """The scheduler and the tokenizer manager ask the PD component / role, never the mode."""
    files = sorted(MANAGERS.rglob("*.py"))
    assert (
        MANAGERS / "scheduler" / "scheduler.py" in files
        and MANAGERS / "tokenizer" / "tokenizer_manager.py" in files
    )
    for path in files:
        text = path.read_text(encoding="utf-8")
        for word in (
            '"prefill"',
            '"decode"',
            '"null"',
            '"fake"',
            "disaggregation_mode",
            "is not None and self.disagg",
        ):
            assert word not in text, f"{path.relative_to(MANAGERS)}: {word}"


def test_role_answers_the_request_side_and_the_bootstrap_server():
    def role(mode: str, backend: str = "mooncake") -> DisaggregationRole:
        return DisaggregationRole.of(_args(mode, backend))

    assert not role("null").enabled and role("prefill").enabled and role("decode", "fake").enabled
    assert role("prefill").runs_bootstrap_server()  # its ranks register there
    assert not role("prefill", "fake").runs_bootstrap_server()  # fake rooms need no peer
    assert not role("decode").runs_bootstrap_server() and not role("null").runs_bootstrap_server()
