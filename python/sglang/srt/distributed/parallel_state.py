"""Parallel layout (pure rank maths) and process groups, passed explicitly to constructors.

The foundation runs one rank; the distributed-runtime issue fills in multi-rank group building.
`GroupCoordinator` collectives are no-ops for a group of size 1, so layers written against it work
unchanged when the group grows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ParallelLayout:
    pp: int = 1
    tp: int = 1
    attn_dp: int = 1
    attn_cp: int = 1
    moe_ep: int = 1

    @property
    def world_size(self) -> int:
        return self.pp * self.tp

    @property
    def attn_tp(self) -> int:
        return self.tp // (self.attn_dp * self.attn_cp)

    @property
    def moe_tp(self) -> int:
        return self.tp // self.moe_ep

    def validate(self) -> None:
        for name in ("pp", "tp", "attn_dp", "attn_cp", "moe_ep"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} size must be >= 1, got {getattr(self, name)}")
        if self.tp % (self.attn_dp * self.attn_cp):
            raise ValueError(
                f"tp ({self.tp}) must be divisible by attn_dp * attn_cp ({self.attn_dp} * {self.attn_cp})"
            )
        if self.tp % self.moe_ep:
            raise ValueError(f"tp ({self.tp}) must be divisible by moe_ep ({self.moe_ep})")


class GroupCoordinator:
    """One named axis: this rank's position in it and its collectives."""

    def __init__(self, name: str, ranks: list[int], rank: int, device_group=None, cpu_group=None):
        self.name = name
        self.ranks = ranks
        self.rank = rank  # rank inside the group
        self.size = len(ranks)
        self.device_group = device_group
        self.cpu_group = cpu_group

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return tensor
        dist.all_reduce(tensor, group=self.device_group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    def broadcast_object(self, obj=None, src: int = 0):
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.ranks[src], group=self.cpu_group)
        return box[0]


@dataclass
class ParallelGroups:
    layout: ParallelLayout
    world_rank: int
    tp: GroupCoordinator
    pp: GroupCoordinator
    attn_cp: GroupCoordinator
    attn_tp: GroupCoordinator
    moe_ep: GroupCoordinator

    @staticmethod
    def single() -> "ParallelGroups":
        def one(name: str) -> GroupCoordinator:
            return GroupCoordinator(name, [0], 0)

        return ParallelGroups(
            layout=ParallelLayout(),
            world_rank=0,
            tp=one("tp"),
            pp=one("pp"),
            attn_cp=one("attn_cp"),
            attn_tp=one("attn_tp"),
            moe_ep=one("moe_ep"),
        )

    @property
    def is_entry_rank(self) -> bool:
        return self.pp.is_first and self.tp.is_first


def optional_groups(groups: Optional[ParallelGroups]) -> ParallelGroups:
    return groups if groups is not None else ParallelGroups.single()
