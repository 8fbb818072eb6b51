"""Start and stop torch.distributed for one rank (TCP store rendezvous at `host:port`)."""

from __future__ import annotations

import datetime
from typing import Optional

import torch.distributed as dist

from sglang.srt.utils.network import get_free_port  # noqa: F401  (re-exported: callers pick ports here)


def parse_host_port(addr: str) -> tuple[str, int]:
    """ "host:port" (or "[ipv6]:port") -> (host, port); ValueError naming the address otherwise."""
    host, sep, port = str(addr).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"distributed init address must look like host:port, got {addr!r}")
    return host.strip("[]"), int(port)


def init_distributed(
    world_size: int,
    world_rank: int,
    dist_init_addr: str,
    backend: str = "gloo",
    timeout_s: Optional[float] = 300.0,
) -> None:
    """`torch.distributed.init_process_group` with `init_method=tcp://host:port`.

    Every rank calls it with the same world size, address and backend; rank 0 hosts the store.
    Idempotent for the same world (a second call with a different world raises)."""
    if not 0 <= world_rank < world_size:
        raise ValueError(f"world_rank {world_rank} out of range for world_size {world_size}")
    host, port = parse_host_port(dist_init_addr)
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != world_rank:
            raise RuntimeError(
                f"torch.distributed already initialised as rank {dist.get_rank()}/{dist.get_world_size()}, "
                f"asked for {world_rank}/{world_size}"
            )
        return
    url_host = f"[{host}]" if ":" in host else host
    kwargs = {}
    if timeout_s is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=float(timeout_s))
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{url_host}:{port}",
        world_size=world_size,
        rank=world_rank,
        **kwargs,
    )


def destroy_distributed() -> None:
    """Tear down every process group of this process (safe to call when none exists)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def init_rank_distributed(
    layout,
    world_rank: int,
    device: str,
    dist_init_addr: Optional[str],
    timeout_s: Optional[float] = 300.0,
    nnodes: int = 1,
):
    """A rank's start-up: bind it to its device first (`platforms.rank_device.bind_rank`: the
    platform of `device`, i.e. `--device`; the node-local device made current before anything
    is allocated; kernels loaded), then join torch.distributed with that platform's backend
    (gloo / nccl / hccl) when the world has more than one rank, and build every axis' groups on
    the rank's device. Returns the `ParallelGroups`."""
    from sglang.srt.distributed.parallel_state import ParallelGroups
    from sglang.srt.platforms.rank_device import bind_rank

    rank = bind_rank(device, world_rank, layout.world_size, nnodes)
    if layout.world_size == 1:
        return ParallelGroups.single(rank.device)
    init_distributed(layout.world_size, world_rank, dist_init_addr, rank.dist_backend, timeout_s)
    return ParallelGroups.build(layout, world_rank, rank.dist_backend, rank.device)
