"""ZMQ sockets of the scheduler entry rank: requests in, token ids and control replies out.

`SchedulerPort` is what a scheduler loop needs of them (`Scheduler.event_loop`, the PP driver,
and test doubles such as `sglang.test.pp_harness.ScriptedIO`): `recv_all` the tokenizer's
messages, `reply` to the tokenizer (control replies), `emit` token ids to the detokenizer.
"""

from __future__ import annotations

from typing import Any, Protocol

import zmq

from sglang.srt.server_args import PortArgs

IDLE_POLL_MS = 1000  # how long an idle scheduler blocks before re-checking its surroundings


class SchedulerPort(Protocol):
    def recv_all(self, block: bool) -> list: ...

    def reply(self, msg: Any) -> None: ...

    def emit(self, out: Any) -> None: ...


class SchedulerIO:
    def __init__(self, port_args: PortArgs):
        self.context = zmq.Context(2)
        self.recv_from_tokenizer = self.context.socket(zmq.PULL)
        self.recv_from_tokenizer.bind(port_args.scheduler_input_ipc_name)
        self.send_to_detokenizer = self.context.socket(zmq.PUSH)
        self.send_to_detokenizer.connect(port_args.detokenizer_ipc_name)
        self.send_to_tokenizer = self.context.socket(zmq.PUSH)
        self.send_to_tokenizer.connect(port_args.tokenizer_ipc_name)
        self.poller = zmq.Poller()
        self.poller.register(self.recv_from_tokenizer, zmq.POLLIN)

    def recv_all(self, block: bool) -> list:
        """Every message waiting now; when `block`, first wait up to IDLE_POLL_MS for one."""
        if block and not self.poller.poll(IDLE_POLL_MS):
            return []
        msgs = []
        while True:
            try:
                msgs.append(self.recv_from_tokenizer.recv_pyobj(zmq.NOBLOCK))
            except zmq.ZMQError:
                return msgs

    def reply(self, msg: Any) -> None:
        """A control reply (flush, abort, internal state) to the tokenizer."""
        self.send_to_tokenizer.send_pyobj(msg)

    def emit(self, out: Any) -> None:
        """A `BatchTokenIDOut` to the detokenizer."""
        self.send_to_detokenizer.send_pyobj(out)

    def close(self) -> None:
        self.context.destroy(linger=0)


class HeartbeatSender:
    """The watchdog thread's own socket to the tokenizer (ZMQ sockets stay in one thread): build
    it in that thread, then call it with each `SchedulerHeartbeat`."""

    def __init__(self, port_args: PortArgs):
        self.context = zmq.Context(1)
        self.socket = self.context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.SNDHWM, 16)  # heartbeats are disposable: never pile them up
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(port_args.tokenizer_ipc_name)

    def __call__(self, msg: Any) -> None:
        try:
            self.socket.send_pyobj(msg, zmq.NOBLOCK)
        except zmq.Again:
            pass  # the tokenizer is not reading: drop this beat
