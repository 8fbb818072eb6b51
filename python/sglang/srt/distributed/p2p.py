"""Point-to-point messages: the ONE wire format for sending a typed message with tensors.

A message is a small int `kind`, an int `mb_id` (the pipeline ring's micro-batch id; 0 for other
users), a picklable object and named tensors. Both `GroupCoordinator`'s object / tensor-dict
helpers and the pipeline ring's links (`pp_comm.py`) send with `isend_message` and receive with
`recv_message`:

  header  int64[4] = (kind, mb_id, payload bytes, number of tensors)    tag HEADER_TAG
  payload pickled (obj, [(key, shape, dtype name)])                      tag 100 + kind
  tensors raw bytes of each non-empty tensor, in order                   tag 200 + kind

Header and payload go over `group` (gloo), the tensors over `tensor_group` (the device backend's
group; the same gloo group on CPU). Ranks are world ranks, as `torch.distributed` takes them with
a group. Sends are `isend`s; the returned `PendingSend` keeps the buffers alive until `wait()`
commits them (pp-cp.md invariant 3).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

HEADER_TAG = 1


class PendingSend:
    """Handles of asynchronous sends (or receives) plus the buffers they use.

    The buffers are kept alive until `wait()` returns (a buffer freed or reused before its send
    completes would corrupt the message)."""

    def __init__(self, works: Sequence[Any] = (), buffers: Sequence[torch.Tensor] = ()):
        self.works = [w for w in works if w is not None]
        self.buffers = list(buffers)

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)

    def wait(self) -> None:
        for w in self.works:
            w.wait()
        self.works, self.buffers = [], []


@dataclass
class Message:
    """One received (or to-be-sent) message."""

    kind: int
    mb_id: int = 0
    obj: Any = None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def payload_tag(kind: int) -> int:
    return 100 + int(kind)


def tensor_tag(kind: int) -> int:
    return 200 + int(kind)


def _raw(t: torch.Tensor) -> torch.Tensor:
    """A uint8 view of a contiguous tensor's bytes (p2p moves bytes, whatever the dtype)."""
    return t.reshape(-1).view(torch.uint8)


def isend_message(
    dst: int,
    group: Any,
    tensor_group: Any,
    kind: int,
    mb_id: int = 0,
    obj: Any = None,
    tensors: Optional[dict[str, torch.Tensor]] = None,
) -> PendingSend:
    """Start sending one message to world rank `dst`; keep the handle until `wait()`."""
    tensors = {k: t.contiguous() for k, t in (tensors or {}).items()}
    meta = [(k, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for k, t in tensors.items()]
    body = torch.frombuffer(bytearray(pickle.dumps((obj, meta))), dtype=torch.uint8)
    header = torch.tensor([int(kind), int(mb_id), body.numel(), len(meta)], dtype=torch.int64)
    works = [
        dist.isend(header, dst=dst, group=group, tag=HEADER_TAG),
        dist.isend(body, dst=dst, group=group, tag=payload_tag(kind)),
    ]
    buffers = [header, body]
    for t in tensors.values():
        if t.numel():  # both sides know the shape: an empty tensor moves nothing
            works.append(dist.isend(_raw(t), dst=dst, group=tensor_group, tag=tensor_tag(kind)))
            buffers.append(t)
    return PendingSend(works, buffers)


def recv_message(src: int, group: Any, tensor_group: Any, device: Optional[torch.device] = None) -> Message:
    """Receive the next message from world rank `src` (blocking); tensors land on `device`."""
    header = torch.empty(4, dtype=torch.int64)
    dist.recv(header, src=src, group=group, tag=HEADER_TAG)
    kind, mb_id, nbytes, _ = header.tolist()
    body = torch.empty(nbytes, dtype=torch.uint8)
    dist.recv(body, src=src, group=group, tag=payload_tag(kind))
    obj, meta = pickle.loads(body.numpy().tobytes())
    tensors: dict[str, torch.Tensor] = {}
    for key, shape, dtype in meta:
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        if t.numel():
            dist.recv(_raw(t), src=src, group=tensor_group, tag=tensor_tag(kind))
        tensors[key] = t
    return Message(int(kind), int(mb_id), obj, tensors)
