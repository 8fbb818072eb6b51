"""`GroupCoordinator`: one named parallel axis group seen from one rank, with its collectives.

Each coordinator holds a *device group* (nccl / hccl / gloo, for tensors on the rank's device) and
a gloo *CPU group* (for pickled objects and small control messages). Every `src` / `dst` argument
is an index INSIDE the group (0 .. size-1), never a world rank. With size 1 every collective is a
no-op that returns its input, so layers written against a coordinator run unchanged on one rank
(and a coordinator built without process groups works for weight-loader maths).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from sglang.srt.distributed.p2p import PendingSend, isend_message, recv_message

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class GroupCoordinator:
    """One axis group (`ranks` are world ranks in axis order; `rank` is this rank's index)."""

    def __init__(
        self,
        name: str,
        ranks: list[int],
        rank: int,
        device_group: Any = None,
        cpu_group: Any = None,
        device: Optional[torch.device] = None,
    ):
        if not 0 <= rank < len(ranks):
            raise ValueError(f"{name}: rank {rank} out of range for a group of {len(ranks)}")
        self.name = name
        self.ranks = list(ranks)
        self.rank = rank
        self.size = len(ranks)
        self.device_group = device_group
        self.cpu_group = cpu_group
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    def __repr__(self) -> str:
        return f"GroupCoordinator({self.name!r}, ranks={self.ranks}, rank={self.rank})"

    # ------------------------------------------------------------------ positions
    @property
    def world_rank(self) -> int:
        return self.ranks[self.rank]

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1

    @property
    def next_rank(self) -> int:
        """In-group index of the next rank round the ring."""
        return (self.rank + 1) % self.size

    @property
    def prev_rank(self) -> int:
        """In-group index of the previous rank round the ring."""
        return (self.rank - 1) % self.size

    def _world(self, index: int) -> int:
        if not 0 <= index < self.size:
            raise ValueError(f"{self.name}: in-group index {index} out of range [0, {self.size})")
        return self.ranks[index]

    def _need_groups(self) -> None:
        if self.device_group is None or self.cpu_group is None:
            raise RuntimeError(f"{self.name}: group of {self.size} ranks has no process groups (not built)")

    # ------------------------------------------------------------------ tensor collectives
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In-place reduction over the group; returns `tensor`."""
        if self.size == 1:
            return tensor
        self._need_groups()
        dist.all_reduce(tensor, op=_REDUCE_OPS[op], group=self.device_group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenation along `dim` of every rank's same-shape tensor, in group order
        (0-dim tensors gather into a 1-D tensor of `size` values)."""
        if tensor.dim() == 0:
            tensor, dim = tensor.reshape(1), 0
        if self.size == 1:
            return tensor
        self._need_groups()
        t = tensor.contiguous()
        shape = tuple(t.shape)
        dim = dim % len(shape)
        out = torch.empty((self.size,) + shape, dtype=t.dtype, device=t.device)
        _all_gather_single(out.view((self.size * shape[0],) + shape[1:]), t, group=self.device_group)
        merged = shape[:dim] + (self.size * shape[dim],) + shape[dim + 1 :]
        return out.movedim(0, dim).reshape(merged)

    def all_gather_list(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's same-shape tensor, as a list in group order."""
        if self.size == 1:
            return [tensor]
        return list(self.all_gather(tensor.unsqueeze(0), dim=0).unbind(0))

    def all_gather_uneven(
        self, tensor: torch.Tensor, dim: int = 0, sizes: Optional[Sequence[int]] = None
    ) -> list[torch.Tensor]:
        """Every rank's tensor, sizes along `dim` may differ (other dims must match).

        Pads to the largest size, gathers, and trims. Pass `sizes` (every rank's size along `dim`)
        when all ranks already know them, to skip the size exchange."""
        if self.size == 1:
            return [tensor]
        dim = dim % tensor.dim()
        if sizes is None:
            mine = torch.tensor([tensor.shape[dim]], dtype=torch.int64, device=tensor.device)
            sizes = [int(s) for s in self.all_gather(mine, dim=0).tolist()]
        if len(sizes) != self.size or sizes[self.rank] != tensor.shape[dim]:
            raise ValueError(
                f"{self.name}: sizes {list(sizes)} do not match this rank's size {tensor.shape[dim]}"
            )
        longest = max(sizes)
        padded = tensor
        if tensor.shape[dim] < longest:
            pad_shape = list(tensor.shape)
            pad_shape[dim] = longest - tensor.shape[dim]
            padded = torch.cat([tensor, tensor.new_zeros(pad_shape)], dim=dim)
        parts = self.all_gather_list(padded)
        return [p.narrow(dim, 0, n) for p, n in zip(parts, sizes)]

    def reduce_scatter(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """This rank's chunk (along `dim`, equal chunks in group order) of the group sum."""
        if self.size == 1:
            return tensor
        self._need_groups()
        dim = dim % tensor.dim()
        if tensor.shape[dim] % self.size:
            raise ValueError(
                f"{self.name}: reduce_scatter size {tensor.shape[dim]} not divisible by {self.size}"
            )
        moved = tensor.movedim(dim, 0).contiguous()
        out = torch.empty(
            (moved.shape[0] // self.size,) + tuple(moved.shape[1:]), dtype=moved.dtype, device=moved.device
        )
        _reduce_scatter_single(out, moved, group=self.device_group)
        return out.movedim(0, dim)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """In-place broadcast of `src`'s tensor (every rank passes a buffer of the same shape)."""
        if self.size == 1:
            return tensor
        self._need_groups()
        dist.broadcast(tensor, src=self._world(src), group=self.device_group)
        return tensor

    def barrier(self) -> None:
        if self.size == 1:
            return
        self._need_groups()
        dist.barrier(group=self.cpu_group)

    # ------------------------------------------------------------------ object collectives (CPU group)
    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """`src`'s picklable object on every rank (others pass anything, e.g. None)."""
        if self.size == 1:
            return obj
        self._need_groups()
        box = [obj]
        dist.broadcast_object_list(box, src=self._world(src), group=self.cpu_group)
        return box[0]

    def all_gather_ints(self, values: Sequence[int]) -> list[list[int]]:
        """Every rank's list of ints (same length on every rank), in group order: one small gloo
        all-gather on the CPU group (cheaper than pickling for per-step control numbers)."""
        if self.size == 1:
            return [list(values)]
        self._need_groups()
        mine = torch.tensor(list(values), dtype=torch.int64)
        out = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(out, mine, group=self.cpu_group)
        return [t.tolist() for t in out]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable object, in group order."""
        if self.size == 1:
            return [obj]
        self._need_groups()
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    # ------------------------------------------------------------------ point to point: tensors (device group)
    def _check_peer(self, peer: int) -> int:
        world = self._world(peer)
        if peer == self.rank:
            raise ValueError(f"{self.name}: cannot send to or receive from itself (index {peer})")
        self._need_groups()
        return world

    # Empty tensors move no bytes (both sides know the shape), so nothing is sent for them.
    def isend(self, tensor: torch.Tensor, dst: int) -> PendingSend:
        peer = self._check_peer(dst)
        if not tensor.numel():
            return PendingSend()
        buf = tensor.contiguous()
        return PendingSend([dist.isend(buf, dst=peer, group=self.device_group)], [buf])

    def irecv(self, tensor: torch.Tensor, src: int) -> PendingSend:
        """Start receiving into `tensor` (contiguous); `.wait()` on the handle before reading it."""
        peer = self._check_peer(src)
        if not tensor.numel():
            return PendingSend()
        return PendingSend([dist.irecv(tensor, src=peer, group=self.device_group)], [tensor])

    # ------------------------------------------------------------------ point to point: messages (p2p.py)
    # Objects and named tensors travel in p2p.py's message format (the pipeline ring's too):
    # header and pickled payload over the CPU group, tensor bytes over the device group.
    def isend_object(self, obj: Any, dst: int) -> PendingSend:
        """Start sending a pickled object; keep the handle until `wait()`."""
        return isend_message(self._check_peer(dst), self.cpu_group, self.device_group, 0, obj=obj)

    def send_object(self, obj: Any, dst: int) -> None:
        self.isend_object(obj, dst).wait()

    def recv_object(self, src: int) -> Any:
        return recv_message(self._check_peer(src), self.cpu_group, self.device_group).obj

    def isend_tensor_dict(self, tensors: dict[str, torch.Tensor], dst: int) -> PendingSend:
        """Start sending named tensors: metadata over the CPU group, data over the device group."""
        return isend_message(self._check_peer(dst), self.cpu_group, self.device_group, 0, tensors=tensors)

    def send_tensor_dict(self, tensors: dict[str, torch.Tensor], dst: int) -> None:
        self.isend_tensor_dict(tensors, dst).wait()

    def recv_tensor_dict(self, src: int, device: Optional[torch.device] = None) -> dict[str, torch.Tensor]:
        """Named tensors sent by `send_tensor_dict` / `isend_tensor_dict`, on `device` (default: the group's)."""
        peer = self._check_peer(src)
        return recv_message(peer, self.cpu_group, self.device_group, device or self.device).tensors
