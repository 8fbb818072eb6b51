"""ZMQ sockets of the scheduler entry rank: requests in, token ids and control replies out.

`SchedulerPort` is what a scheduler loop needs of them (`Scheduler.event_loop`, the PP driver,
and test doubles such as `sglang.test.pp_harness.ScriptedIO`): `recv_all` the tokenizer's
messages, `reply` to the tokenizer (control replies), `emit` token ids to the detokenizer.
With attention DP each replica's entry rank has one: its messages come from the data-parallel
controller, its control replies and load reports (`report`) go back to it.
"""

from __future__ import annotations

from typing import Any, Protocol

import zmq

from sglang.srt.managers.io_struct import DPReply
from sglang.srt.model_executor.step_label import step_label
from sglang.srt.server_args import PortArgs

IDLE_POLL_MS = 1000  # how long an idle scheduler blocks before re-checking its surroundings


class SchedulerPort(Protocol):
    def recv_all(self, block: bool) -> list: ...

    def reply(self, msg: Any) -> None: ...

    def report(self, msg: Any) -> None:
        """A load report to the data-parallel controller (attention DP only)."""
        self.send_to_tokenizer.send_pyobj(msg)

    def emit(self, out: Any) -> None: ...


class SchedulerIO:
    def __init__(self, port_args: PortArgs, dp_rank: int = 0, dp_size: int = 1):
        self.context = zmq.Context(2)
        self.recv_from_tokenizer = self.context.socket(zmq.PULL)
        self.recv_from_tokenizer.bind(port_args.replica_input_ipc_name(dp_rank, dp_size))
        self.send_to_detokenizer = self.context.socket(zmq.PUSH)
        self.send_to_detokenizer.connect(port_args.detokenizer_ipc_name)
        self.send_to_tokenizer = self.context.socket(zmq.PUSH)
        self.send_to_tokenizer.connect(port_args.control_reply_ipc_name(dp_size))
        self.dp_rank = dp_rank if dp_size > 1 else None  # replies go to the DP controller, tagged
        self.poller = zmq.Poller()
        self.poller.register(self.recv_from_tokenizer, zmq.POLLIN)

    def recv_all(self, block: bool) -> list:
        """Every message waiting now; when `block`, first wait up to IDLE_POLL_MS for one."""
        if block and not self.poller.poll(IDLE_POLL_MS):
            return []
        msgs = []
        with step_label("sched.recv"):
            while True:
                try:
                    msgs.append(self.recv_from_tokenizer.recv_pyobj(zmq.NOBLOCK))
                except zmq.ZMQError:
                    return msgs

    def reply(self, msg: Any) -> None:
        """A control reply (flush, abort, internal state) to the tokenizer (or the DP controller)."""
        self.send_to_tokenizer.send_pyobj(msg if self.dp_rank is None else DPReply(self.dp_rank, msg))

    def report(self, msg: Any) -> None:
        """A load report to the data-parallel controller (attention DP only)."""
        self.send_to_tokenizer.send_pyobj(msg)

    def emit(self, out: Any) -> None:
        """A `BatchTokenIDOut` to the detokenizer."""
        with step_label("sched.emit"):
            self.send_to_detokenizer.send_pyobj(out)

    def close(self) -> None:
        self.context.destroy(linger=0)


class HeartbeatSender:
    """The watchdog thread's own socket to the tokenizer (ZMQ sockets stay in one thread): build
    it in that thread, then call it with each `SchedulerHeartbeat`."""

    def __init__(self, port_args: PortArgs, dp_size: int = 1):
        self.context = zmq.Context(1)
        self.socket = self.context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.SNDHWM, 16)  # heartbeats are disposable: never pile them up
        self.socket.setsockopt(zmq.LINGER, 0)
        # the tokenizer, or (attention DP) the data-parallel controller, which merges the replicas'
        self.socket.connect(port_args.control_reply_ipc_name(dp_size))

    def __call__(self, msg: Any) -> None:
        try:
            self.socket.send_pyobj(msg, zmq.NOBLOCK)
        except zmq.Again:
            pass  # the tokenizer is not reading: drop this beat


class ThreadOutputSender:
    """A helper thread's own socket to the detokenizer (ZMQ sockets stay in one thread): built on
    the first call, in the calling thread; then called with each `BatchTokenIDOut`. The PD
    prefill side's early answers use it (disaggregation/prefill.py)."""

    def __init__(self, port_args: PortArgs):
        self.endpoint = port_args.detokenizer_ipc_name
        self.socket = None

    def __call__(self, out: Any) -> None:
        if self.socket is None:
            self.context = zmq.Context(1)
            self.socket = self.context.socket(zmq.PUSH)
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.connect(self.endpoint)
        self.socket.send_pyobj(out)
