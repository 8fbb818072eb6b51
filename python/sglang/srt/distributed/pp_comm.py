"""Point-to-point links of the pipeline ring: asynchronous typed sends, receiver threads, an inbox.

Each directed link of the ring (stage k -> k+1 for every tp coordinate, and last stage -> stage 0
for the first tp coordinate of each attention-DP replica (tp 0 when dp = 1), which carries the
sampled outputs back) gets its own gloo process group, used
by exactly one thread at each end: the main loop sends, a receiver thread on the other end reads.
The receiver thread puts every message into the rank's `Inbox`, demultiplexed by kind, so a proxy
is never taken for an output and the main loop can poll for outputs without blocking (gloo's
`Work.is_completed()` is not usable for point-to-point receives). It also prefetches the next
micro-batch's activations while the main loop computes.

Messages use `p2p.py`'s wire format (the one `GroupCoordinator` uses too). Message kinds are plain
ints here: their meaning belongs to the ring (`managers/pp/messages.py`, `MsgType`); the transport
only knows `stop_kind`, the kind after which a link's receiver thread ends.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union

import torch
import torch.distributed as dist

from sglang.srt.distributed.p2p import Message, PendingSend, isend_message, recv_message
from sglang.srt.distributed.parallel_state import ParallelGroups

logger = logging.getLogger(__name__)

# A ring link may sit idle for a long time (no requests); the driver pings it well within this.
LINK_TIMEOUT = datetime.timedelta(days=1)


@dataclass
class Link:
    """One directed link between two world ranks, with its own process groups."""

    src: int
    dst: int
    group: Any  # gloo: header + payload (and tensors on CPU)
    tensor_group: Any  # the device backend's group for tensors (the gloo group on CPU)

    def send(
        self, kind: int, mb_id: int, obj: Any = None, tensors: Optional[dict[str, torch.Tensor]] = None
    ) -> PendingSend:
        """Start sending one message; keep the handle until `wait()` (buffers live in it)."""
        return isend_message(self.dst, self.group, self.tensor_group, kind, mb_id, obj, tensors)


class Inbox:
    """Received messages by kind, in arrival order; thread-safe (receiver threads put, the loop takes)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queues: defaultdict[int, deque[tuple[int, Message]]] = defaultdict(deque)
        self._seq = 0
        self._error: Optional[str] = None

    def put(self, msg: Message) -> None:
        with self._cond:
            self._seq += 1
            self._queues[msg.kind].append((self._seq, msg))
            self._cond.notify_all()

    def fail(self, error: str) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def take(
        self, kinds: Union[int, Iterable[int]], block: bool = True, timeout: Optional[float] = None
    ) -> Optional[Message]:
        """The earliest message of one of `kinds`; None when none is there and not `block`, or
        none came within `timeout` seconds. Raises RuntimeError when a receiver failed (a peer
        died) and nothing is left to take."""
        wanted = (kinds,) if isinstance(kinds, int) else tuple(kinds)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                heads = [self._queues[k] for k in wanted if self._queues[k]]
                if heads:
                    return min(heads, key=lambda q: q[0][0]).popleft()[1]
                if self._error is not None:
                    raise RuntimeError(f"pipeline link failed: {self._error}")
                left = None if deadline is None else deadline - time.monotonic()
                if not block or (left is not None and left <= 0):
                    return None
                self._cond.wait(left)

    def take_all(self, kind: int) -> list[Message]:
        out = []
        while (msg := self.take(kind, block=False)) is not None:
            out.append(msg)
        return out


class _Receiver(threading.Thread):
    """Reads messages from one link into the inbox until `stop_kind` (or an error, which it reports)."""

    def __init__(self, link: Link, inbox: Inbox, device: torch.device, stop_kind: int):
        super().__init__(name=f"pp-recv-from-{link.src}", daemon=True)
        self.link, self.inbox, self.device, self.stop_kind = link, inbox, device, stop_kind

    def run(self) -> None:
        link = self.link
        try:
            while True:
                msg = recv_message(link.src, link.group, link.tensor_group, self.device)
                self.inbox.put(msg)
                if msg.kind == self.stop_kind:
                    return
        except Exception as exc:  # noqa: BLE001 - the loop thread re-raises it
            self.inbox.fail(f"receiving from world rank {link.src}: {exc}")


class PPComm:
    """This rank's ends of the ring's links, and its inbox.

    Building it is collective (every world rank creates every link's groups in the same order)."""

    def __init__(
        self,
        groups: ParallelGroups,
        stop_kind: int,
        backend: str = "gloo",
        device: Optional[torch.device] = None,
    ):
        layout = groups.layout
        me = groups.world_rank
        coords = layout.coords(me)
        self.pp_rank, self.tp_rank, self.pp_size = coords.pp, coords.tp, layout.pp
        # the first rank of each attention-DP replica (tp coordinate 0 when dp = 1) returns outputs
        self.replica_size = layout.attn_cp * layout.attn_tp
        self.device = device or groups.tp.device
        self.inbox = Inbox()
        self.next_link: Optional[Link] = None  # to stage k+1 (not on the last stage)
        self.return_link: Optional[Link] = None  # last stage, a replica's first rank: outputs back to stage 0
        incoming: list[Link] = []
        for col in range(layout.tp):
            for k in range(layout.pp):
                if k == layout.pp - 1 and col % self.replica_size:
                    continue  # only each replica's first rank returns outputs
                src, dst = layout.world_rank_of(k, col), layout.world_rank_of((k + 1) % layout.pp, col)
                link = self._make_link(src, dst, backend)
                if me == src:
                    if k < layout.pp - 1:
                        self.next_link = link
                    else:
                        self.return_link = link
                if me == dst:
                    incoming.append(link)
        self._receivers = [_Receiver(link, self.inbox, self.device, stop_kind) for link in incoming]
        for r in self._receivers:
            r.start()

    @staticmethod
    def _make_link(src: int, dst: int, backend: str) -> Link:
        ranks = sorted((src, dst))
        group = dist.new_group(ranks, backend="gloo", timeout=LINK_TIMEOUT)
        tensor_group = (
            group if backend == "gloo" else dist.new_group(ranks, backend=backend, timeout=LINK_TIMEOUT)
        )
        return Link(src, dst, group, tensor_group)

    @property
    def receives_outputs(self) -> bool:
        """Stage 0, first rank of a replica (tp 0 when dp = 1): the outputs of the last stage come here."""
        return self.pp_rank == 0 and self.tp_rank % self.replica_size == 0

    def send_next(
        self, kind: int, mb_id: int, obj: Any = None, tensors: Optional[dict[str, torch.Tensor]] = None
    ) -> PendingSend:
        if self.next_link is None:
            raise RuntimeError("the last pipeline stage has no next stage")
        return self.next_link.send(kind, mb_id, obj, tensors)

    def send_return(self, kind: int, mb_id: int, obj: Any = None) -> Optional[PendingSend]:
        """Last stage -> stage 0 (only each replica's first rank has this link; others return None)."""
        if self.return_link is None:
            return None
        return self.return_link.send(kind, mb_id, obj)

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the receiver threads to end (after the stop message went round)."""
        for r in self._receivers:
            r.join(timeout)
