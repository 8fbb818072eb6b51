"""A rank's device, chosen once at the start of its process, before it allocates anything.

    rank = bind_rank(server_args.device, world_rank, world_size, nnodes)
    init_distributed(world_size, world_rank, addr, rank.dist_backend)       # gloo / nccl / hccl
    groups = ParallelGroups.build(layout, world_rank, rank.dist_backend, rank.device)

Everything here follows `--device` (the platform named by it), never which accelerator happens to
be visible: a `--device cpu` run on a CUDA machine uses gloo and host memory. Devices are picked
by the node-local rank (`world_rank` minus the ranks of the nodes before this one), so rank 9 of
a 2-node x 8-GPU world runs on GPU 1 of node 1, and every rank of a node has its own device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.srt.platforms import get_platform
from sglang.srt.platforms.base import Platform


def ranks_per_node(world_size: int, nnodes: int = 1) -> int:
    """Ranks on each node (the world is split evenly over the nodes, node-major)."""
    nnodes = max(1, int(nnodes))
    if world_size < 1 or world_size % nnodes:
        raise ValueError(f"the world size ({world_size}) must be a positive multiple of --nnodes ({nnodes})")
    return world_size // nnodes


def local_rank_of(world_rank: int, world_size: int, nnodes: int = 1) -> int:
    """The node-local index of a world rank (ranks are laid out node by node)."""
    if not 0 <= world_rank < world_size:
        raise ValueError(f"world rank {world_rank} out of range for world size {world_size}")
    return world_rank % ranks_per_node(world_size, nnodes)


@dataclass(frozen=True)
class RankDevice:
    """Where one rank runs: its platform, ranks and device."""

    platform: Platform
    world_rank: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def dist_backend(self) -> str:
        """The torch.distributed backend of the platform (gloo / nccl / hccl)."""
        return self.platform.dist_backend


def bind_rank(
    device: str, world_rank: int, world_size: int, nnodes: int = 1, load_kernels: bool = True
) -> RankDevice:
    """Bind this process to its rank's device: the platform of `device` (`--device`), its
    node-local device made current before anything is allocated, and the platform's fused kernels
    loaded now, so that a rank reports ready only with them in memory (they are built at install
    time; loading is an import). The platform object is the process's (`get_platform`), the one
    that holds its kernel table and dtype choice from here on."""
    platform = get_platform(device)
    local = local_rank_of(world_rank, world_size, nnodes)
    platform.set_device(local)
    if load_kernels:
        platform.kernels.fused()  # kept by the platform: the layers' kernel_dispatch asks it
    return RankDevice(
        platform=platform,
        world_rank=world_rank,
        local_rank=local,
        local_world_size=ranks_per_node(world_size, nnodes),
        device=platform.current_device(),
    )
