"""Start and stop torch.distributed for one rank (TCP store rendezvous at `host:port`)."""

from __future__ import annotations

import datetime
import random
import socket
from typing import Optional

import torch.distributed as dist


def parse_host_port(addr: str) -> tuple[str, int]:
    """ "host:port" (or "[ipv6]:port") -> (host, port); ValueError naming the address otherwise."""
    host, sep, port = str(addr).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"distributed init address must look like host:port, got {addr!r}")
    return host.strip("[]"), int(port)


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default when the range cannot be read
LOWEST_PICK = 10000  # below this: well-known and registered services
PICK_TRIES = 64


def ephemeral_port_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The ports the OS hands to outgoing connections and to `bind(0)` (Linux's setting; the
    Linux default where the file is missing or unreadable)."""
    try:
        with open(path) as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return (lo, hi) if 0 < lo <= hi < 65536 else DEFAULT_EPHEMERAL


def _pick_range(ephemeral: tuple[int, int]) -> tuple[int, int]:
    """The widest span of [LOWEST_PICK, 65535] outside the ephemeral range (inclusive bounds)."""
    lo, hi = ephemeral
    below, above = (LOWEST_PICK, lo - 1), (hi + 1, 65535)
    return max(below, above, key=lambda r: r[1] - r[0])


def _tcp_socket(host: str) -> socket.socket:
    return socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)


def _bindable(host: str, port: int) -> bool:
    with _tcp_socket(host) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def get_free_port(host: str = "127.0.0.1", pick: Optional[tuple[int, int]] = None) -> int:
    """A TCP port that was free on `host` a moment ago, for a server that binds it later.

    Picked at random outside the OS's ephemeral range: a port from `bind(0)` is an ephemeral
    one, which any outgoing connection on the machine may take as its source port between the
    pick and the server's bind (a rendezvous failed with EADDRINUSE under a parallel test run
    that way). `pick` overrides the range picked from (inclusive). Falls back to `bind(0)` when
    no random pick is free."""
    lo, hi = pick or _pick_range(ephemeral_port_range())
    rng = random.SystemRandom()  # no shared seed across forked processes
    if hi >= lo:
        for _ in range(PICK_TRIES):
            port = rng.randint(lo, hi)
            if _bindable(host, port):
                return port
    with _tcp_socket(host) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
