"""What both sides' Mooncake managers share: the data plane, the PULL socket and the thread that
reads it, the outbox of PUSH sockets to peers (mooncake/__init__.py has the protocol)."""

from __future__ import annotations

import logging
import threading
from abc import abstractmethod
from typing import Any

import zmq

from sglang.srt.disaggregation.base.conn import BaseKVManager, KVManagerArgs, Timeouts
from sglang.srt.disaggregation.mooncake.data_plane import DataPlane

logger = logging.getLogger(__name__)

RECV_POLL_MS = 100


class Outbox:
    """PUSH sockets to peers, shared by threads (ZMQ sockets are not thread-safe: one lock)."""

    def __init__(self, context: zmq.Context):
        self.context = context
        self.lock = threading.Lock()
        self.sockets: dict[str, zmq.Socket] = {}

    def send(self, endpoint: str, msg: Any) -> bool:
        with self.lock:
            sock = self.sockets.get(endpoint)
            if sock is None:
                sock = self.context.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 100000)
                sock.connect(endpoint)
                self.sockets[endpoint] = sock
            try:
                sock.send_pyobj(msg, zmq.NOBLOCK)
                return True
            except zmq.ZMQError as err:
                logger.warning("could not send %s to %s: %s", type(msg).__name__, endpoint, err)
                return False

    def close(self) -> None:
        with self.lock:
            for s in self.sockets.values():
                s.close(0)
            self.sockets.clear()


class MooncakeKVManager(BaseKVManager):
    """The shared part of a rank's Mooncake manager; subclasses `handle` the incoming messages."""

    def __init__(self, args: KVManagerArgs, data_plane: DataPlane):
        self.place = args.place
        self.ip = args.ip
        self.regions = args.regions
        self.kv_dtype = args.kv_dtype
        self.bootstrap = args.bootstrap
        self.data_plane = data_plane
        self.timeouts = Timeouts.from_env()
        self.context = zmq.Context(1)
        self.inbox = self.context.socket(zmq.PULL)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.port = self.inbox.bind_to_random_port(f"tcp://{args.ip}")
        self.endpoint = f"tcp://{args.ip}:{self.port}"
        self.outbox = Outbox(self.context)
        self.lock = threading.Lock()
        self.closed = False
        self._recv_thread = threading.Thread(target=self._recv_loop, name="pd-recv", daemon=True)

    def start(self) -> None:
        self._recv_thread.start()

    def _recv_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.inbox, zmq.POLLIN)
        while not self.closed:
            try:
                if not poller.poll(RECV_POLL_MS):
                    continue
                msg = self.inbox.recv_pyobj(zmq.NOBLOCK)
            except zmq.ZMQError:
                if self.closed:
                    return
                continue
            try:
                self.handle(msg)
            except Exception:  # noqa: BLE001 - one bad message must not stop the thread
                logger.exception("PD: failed to handle %s", type(msg).__name__)

    @abstractmethod
    def handle(self, msg: Any) -> None:
        """(recv thread) One incoming control message."""

    def close(self) -> None:
        self.closed = True
        self.outbox.close()
