"""Process groups of one rank: a `GroupCoordinator` per parallel axis, built once, passed explicitly.

    init_distributed(world_size, world_rank, "127.0.0.1:29500", platform.dist_backend)
    groups = ParallelGroups.build(layout, world_rank, backend=platform.dist_backend, device=device)
    model = LlamaForCausalLM(config, groups, dtype)

`ParallelLayout` (pure rank maths) lives in `parallel_layout.py` and is re-exported here.
`ParallelGroups.single()` is the one-rank case: every coordinator has size 1 and no process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
import torch.distributed as dist

from sglang.srt.distributed.group_coordinator import GroupCoordinator
from sglang.srt.distributed.p2p import PendingSend
from sglang.srt.distributed.parallel_layout import AXES, ParallelLayout, RankCoords, resolve_tp_size

__all__ = [
    "AXES",
    "GroupCoordinator",
    "ParallelGroups",
    "ParallelLayout",
    "PendingSend",
    "RankCoords",
    "optional_groups",
    "resolve_tp_size",
]


def _single(name: str, device: Optional[torch.device] = None, world_rank: int = 0) -> GroupCoordinator:
    return GroupCoordinator(name, [world_rank], 0, device=device)


@dataclass
class ParallelGroups:
    """This rank's coordinators of every axis of `layout` (plus `world`).

    `attn_dp`, `moe_tp` and `world` are optional in the constructor for hand-built groups (tests);
    they default to size-1 coordinators."""

    layout: ParallelLayout
    world_rank: int
    tp: GroupCoordinator
    pp: GroupCoordinator
    attn_cp: GroupCoordinator
    attn_tp: GroupCoordinator
    moe_ep: GroupCoordinator
    attn_dp: Optional[GroupCoordinator] = None
    moe_tp: Optional[GroupCoordinator] = None
    world: Optional[GroupCoordinator] = None
    # The ranks of this rank's attention-DP replica in its stage (attn_cp × attn_tp; `layout.replica_ranks`).
    replica: Optional[GroupCoordinator] = None
    # This rank alone (weights replicated on every rank, e.g. dense MLPs with `--moe-dense-tp-size 1`).
    local: Optional[GroupCoordinator] = None

    def __post_init__(self) -> None:
        for name in ("attn_dp", "moe_tp", "world"):
            if getattr(self, name) is None:
                setattr(self, name, _single(name, self.tp.device, self.world_rank))
        if self.local is None:
            self.local = _single("local", self.tp.device, self.world_rank)
        if self.replica is None:
            if self.layout.attn_dp != 1:
                raise ValueError("hand-built groups with attn_dp > 1 need their `replica` coordinator")
            self.replica = self.tp  # one replica: the whole stage

    # ------------------------------------------------------------------ construction
    @staticmethod
    def single(device: Union[str, torch.device, None] = None) -> "ParallelGroups":
        """One rank, no process groups: every collective is a no-op."""
        dev = torch.device(device) if device is not None else None
        return ParallelGroups(
            layout=ParallelLayout(),
            world_rank=0,
            **{axis: _single(axis, dev) for axis in AXES},
            world=_single("world", dev),
        )

    @staticmethod
    def build(
        layout: ParallelLayout,
        world_rank: int,
        backend: Optional[str] = None,
        device: Union[str, torch.device, None] = None,
    ) -> "ParallelGroups":
        """Create every axis' process groups; call on ALL ranks after `init_distributed`.

        For every group of size > 1 of every axis (in the same order on every rank, as
        `dist.new_group` requires) a device group with `backend` (default: the world's) and a gloo
        CPU group are created; axes with the same rank sets share them."""
        layout.validate()
        if layout.world_size == 1 and not dist.is_initialized():
            return ParallelGroups.single(device)
        if not dist.is_initialized():
            raise RuntimeError("ParallelGroups.build needs torch.distributed; call init_distributed first")
        if dist.get_world_size() != layout.world_size:
            raise ValueError(
                f"the process group has {dist.get_world_size()} ranks but the layout needs {layout.world_size} "
                f"({layout.describe()})"
            )
        if dist.get_rank() != world_rank:
            raise ValueError(
                f"world_rank {world_rank} does not match torch.distributed rank {dist.get_rank()}"
            )
        backend = backend or dist.get_backend()
        dev = torch.device(device) if device is not None else torch.device("cpu")
        made: dict[tuple[int, ...], tuple[Any, Any]] = {}
        coordinators: dict[str, GroupCoordinator] = {}
        for axis in ("world",) + AXES:
            groups = [list(range(layout.world_size))] if axis == "world" else layout.all_groups(axis)
            mine: Optional[list[int]] = None
            for ranks in groups:
                key = tuple(ranks)
                if len(ranks) > 1 and key not in made:
                    made[key] = (
                        dist.new_group(ranks, backend=backend),
                        dist.new_group(ranks, backend="gloo"),
                    )
                if world_rank in ranks:
                    mine = ranks
            assert mine is not None, f"rank {world_rank} is in no {axis} group"
            device_group, cpu_group = made.get(tuple(mine), (None, None))
            coordinators[axis] = GroupCoordinator(
                axis, mine, mine.index(world_rank), device_group, cpu_group, dev
            )
        mine = None
        for ranks in layout.all_replica_groups():  # same rank sets as tp when attn_dp = 1: shared groups
            key = tuple(ranks)
            if len(ranks) > 1 and key not in made:
                made[key] = (dist.new_group(ranks, backend=backend), dist.new_group(ranks, backend="gloo"))
            if world_rank in ranks:
                mine = ranks
        assert mine is not None, f"rank {world_rank} is in no attention-DP replica"
        device_group, cpu_group = made.get(tuple(mine), (None, None))
        coordinators["replica"] = GroupCoordinator(
            "replica", mine, mine.index(world_rank), device_group, cpu_group, dev
        )
        return ParallelGroups(layout=layout, world_rank=world_rank, **coordinators)

    # ------------------------------------------------------------------ queries
    def axis(self, name: str) -> GroupCoordinator:
        """The coordinator of an axis by name ("tp", "pp", ..., or "world")."""
        if name not in AXES and name != "world":
            raise ValueError(f"unknown parallel axis {name!r}; expected one of {list(AXES) + ['world']}")
        return getattr(self, name)

    @property
    def coords(self) -> RankCoords:
        return self.layout.coords(self.world_rank)

    @property
    def pp_prev_rank(self) -> int:
        """World rank of the previous pipeline stage's rank with the same tp rank (ring)."""
        return self.layout.pp_neighbors(self.world_rank)[0]

    @property
    def pp_next_rank(self) -> int:
        """World rank of the next pipeline stage's rank with the same tp rank (ring)."""
        return self.layout.pp_neighbors(self.world_rank)[1]

    @property
    def is_entry_rank(self) -> bool:
        """Stage 0, tp rank 0: receives requests from the tokenizer."""
        return self.pp.is_first and self.tp.is_first

    @property
    def is_replica_entry(self) -> bool:
        """Stage 0, first rank of its attention-DP replica: receives that replica's requests
        (the entry rank when attn_dp = 1)."""
        return self.pp.is_first and self.replica.is_first

    @property
    def dp_rank(self) -> int:
        """This rank's attention-DP replica (0 when attn_dp = 1)."""
        return self.layout.coords(self.world_rank).attn_dp


def optional_groups(groups: Optional[ParallelGroups]) -> ParallelGroups:
    return groups if groups is not None else ParallelGroups.single()
