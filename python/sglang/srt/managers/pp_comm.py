"""Point-to-point links of the pipeline ring: typed messages, asynchronous sends, a typed inbox.

Each directed link of the ring (stage k -> k+1 for every tp coordinate, and last stage -> stage 0
for tp coordinate 0, which carries the sampled outputs back) gets its own gloo process group, used
by exactly one thread at each end: the main loop sends, a receiver thread on the other end reads.
The receiver thread puts every message into the rank's `Inbox`, demultiplexed by type, so a proxy
is never taken for an output and the main loop can poll for outputs without blocking (gloo's
`Work.is_completed()` is not usable for point-to-point receives). It also prefetches the next
micro-batch's activations while the main loop computes.

Wire format of one message (distinct tags per message type):
  header  int64[4] = (type, mb_id, payload bytes, number of tensors)   tag HEADER_TAG
  payload pickled (obj, [(key, shape, dtype)])                           tag 100 + type
  tensors raw bytes of each tensor, in order (on the link's tensor group) tag 200 + type
Sends are `isend`s; the returned `PendingSend` keeps the buffers alive until `wait()` commits them.
"""

from __future__ import annotations

import datetime
import logging
import pickle
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Union

import torch
import torch.distributed as dist

from sglang.srt.distributed.parallel_state import ParallelGroups, PendingSend
from sglang.srt.managers.pp_messages import MsgType

logger = logging.getLogger(__name__)

HEADER_TAG = 1
# A ring link may sit idle for a long time (no requests); the driver pings it well within this.
LINK_TIMEOUT = datetime.timedelta(days=1)


def _body_tag(mtype: MsgType) -> int:
    return 100 + int(mtype)


def _tensor_tag(mtype: MsgType) -> int:
    return 200 + int(mtype)


def _raw(t: torch.Tensor) -> torch.Tensor:
    """A uint8 view of a contiguous tensor's bytes (p2p moves bytes, whatever the dtype)."""
    return t.reshape(-1).view(torch.uint8)


@dataclass
class Message:
    type: MsgType
    mb_id: int
    obj: Any = None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Link:
    """One directed link between two world ranks, with its own process groups."""

    src: int
    dst: int
    group: Any  # gloo: header + payload (and tensors on CPU)
    tensor_group: Any  # the device backend's group for tensors (the gloo group on CPU)


def send_message(
    link: Link, mtype: MsgType, mb_id: int, obj: Any = None, tensors: Optional[dict[str, torch.Tensor]] = None
) -> PendingSend:
    """Start sending one typed message; keep the handle until `wait()` (buffers live in it)."""
    tensors = {k: t.contiguous() for k, t in (tensors or {}).items()}
    meta = [(k, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for k, t in tensors.items()]
    body = torch.frombuffer(bytearray(pickle.dumps((obj, meta))), dtype=torch.uint8)
    header = torch.tensor([int(mtype), int(mb_id), body.numel(), len(meta)], dtype=torch.int64)
    works = [
        dist.isend(header, dst=link.dst, group=link.group, tag=HEADER_TAG),
        dist.isend(body, dst=link.dst, group=link.group, tag=_body_tag(mtype)),
    ]
    buffers = [header, body]
    for t in tensors.values():
        if t.numel():
            works.append(dist.isend(_raw(t), dst=link.dst, group=link.tensor_group, tag=_tensor_tag(mtype)))
            buffers.append(t)
    return PendingSend(works, buffers)


class Inbox:
    """Received messages by type, in arrival order; thread-safe (receiver threads put, the loop takes)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queues: dict[MsgType, deque[tuple[int, Message]]] = {t: deque() for t in MsgType}
        self._seq = 0
        self._error: Optional[str] = None

    def put(self, msg: Message) -> None:
        with self._cond:
            self._seq += 1
            self._queues[msg.type].append((self._seq, msg))
            self._cond.notify_all()

    def fail(self, error: str) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def take(self, types: Union[MsgType, Iterable[MsgType]], block: bool = True) -> Optional[Message]:
        """The earliest message of one of `types`; None when none is there and not `block`.
        Raises RuntimeError when a receiver failed (a peer died) and nothing is left to take."""
        wanted = (types,) if isinstance(types, MsgType) else tuple(types)
        with self._cond:
            while True:
                heads = [self._queues[t] for t in wanted if self._queues[t]]
                if heads:
                    return min(heads, key=lambda q: q[0][0]).popleft()[1]
                if self._error is not None:
                    raise RuntimeError(f"pipeline link failed: {self._error}")
                if not block:
                    return None
                self._cond.wait()

    def take_all(self, mtype: MsgType) -> list[Message]:
        out = []
        while (msg := self.take(mtype, block=False)) is not None:
            out.append(msg)
        return out


class _Receiver(threading.Thread):
    """Reads messages from one link into the inbox until STOP (or an error, which it reports)."""

    def __init__(self, link: Link, inbox: Inbox, device: torch.device):
        super().__init__(name=f"pp-recv-from-{link.src}", daemon=True)
        self.link, self.inbox, self.device = link, inbox, device

    def run(self) -> None:
        link = self.link
        try:
            while True:
                header = torch.empty(4, dtype=torch.int64)
                dist.recv(header, src=link.src, group=link.group, tag=HEADER_TAG)
                mtype_i, mb_id, nbytes, _ = header.tolist()
                mtype = MsgType(mtype_i)
                body = torch.empty(nbytes, dtype=torch.uint8)
                dist.recv(body, src=link.src, group=link.group, tag=_body_tag(mtype))
                obj, meta = pickle.loads(body.numpy().tobytes())
                tensors: dict[str, torch.Tensor] = {}
                for key, shape, dtype in meta:
                    t = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
                    if t.numel():
                        dist.recv(_raw(t), src=link.src, group=link.tensor_group, tag=_tensor_tag(mtype))
                    tensors[key] = t
                self.inbox.put(Message(mtype, int(mb_id), obj, tensors))
                if mtype == MsgType.STOP:
                    return
        except Exception as exc:  # noqa: BLE001 - the loop thread re-raises it
            self.inbox.fail(f"receiving from world rank {link.src}: {exc}")


class PPComm:
    """This rank's ends of the ring's links, and its inbox.

    Building it is collective (every world rank creates every link's groups in the same order)."""

    def __init__(self, groups: ParallelGroups, backend: str = "gloo", device: Optional[torch.device] = None):
        layout = groups.layout
        me = groups.world_rank
        coords = layout.coords(me)
        self.pp_rank, self.tp_rank, self.pp_size = coords.pp, coords.tp, layout.pp
        self.device = device or groups.tp.device
        self.inbox = Inbox()
        self.next_link: Optional[Link] = None  # to stage k+1 (not on the last stage)
        self.return_link: Optional[Link] = None  # last stage, tp 0: outputs back to stage 0
        incoming: list[Link] = []
        for col in range(layout.tp):
            for k in range(layout.pp):
                if k == layout.pp - 1 and col != 0:
                    continue  # only tp coordinate 0 returns outputs
                src, dst = layout.world_rank_of(k, col), layout.world_rank_of((k + 1) % layout.pp, col)
                link = self._make_link(src, dst, backend)
                if me == src:
                    if k < layout.pp - 1:
                        self.next_link = link
                    else:
                        self.return_link = link
                if me == dst:
                    incoming.append(link)
        self._receivers = [_Receiver(link, self.inbox, self.device) for link in incoming]
        for r in self._receivers:
            r.start()

    @staticmethod
    def _make_link(src: int, dst: int, backend: str) -> Link:
        ranks = sorted((src, dst))
        group = dist.new_group(ranks, backend="gloo", timeout=LINK_TIMEOUT)
        tensor_group = group if backend == "gloo" else dist.new_group(ranks, backend=backend, timeout=LINK_TIMEOUT)
        return Link(src, dst, group, tensor_group)

    @property
    def receives_outputs(self) -> bool:
        """Stage 0, tp 0: the outputs of the last stage come here."""
        return self.pp_rank == 0 and self.tp_rank == 0

    def send_next(
        self, mtype: MsgType, mb_id: int, obj: Any = None, tensors: Optional[dict[str, torch.Tensor]] = None
    ) -> PendingSend:
        if self.next_link is None:
            raise RuntimeError("the last pipeline stage has no next stage")
        return send_message(self.next_link, mtype, mb_id, obj, tensors)

    def send_return(self, mtype: MsgType, mb_id: int, obj: Any = None) -> Optional[PendingSend]:
        """Last stage -> stage 0 (only tp coordinate 0 has this link; others return None)."""
        if self.return_link is None:
            return None
        return send_message(self.return_link, mtype, mb_id, obj)

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the receiver threads to end (after STOP went round)."""
        for r in self._receivers:
            r.join(timeout)
