"""Free TCP ports for servers that bind later (torch-free: the demo and the benchmarks' launchers
import it without torch)."""

from __future__ import annotations

import random
import socket
from typing import Optional

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
