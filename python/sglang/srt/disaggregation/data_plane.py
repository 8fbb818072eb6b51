"""The data plane: who moves KV bytes between two servers' registered memory.

`MooncakeDataPlane` wraps the PyPI `mooncake-transfer-engine` (the non-CUDA build on CPU
machines): P2P handshake (no metadata server), TCP transport, or RDMA when
`--disaggregation-ib-device` names NICs. Memory is registered once (the whole KV pool); a write
is a batch of (local address, remote address, bytes) triples, page runs rather than tokens.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol, Sequence

logger = logging.getLogger(__name__)

# Mooncake splits nothing itself; keep each batch bounded (one batch = one sync call).
MAX_BATCH_ENTRIES = 4096

INSTALL_HINT = (
    "the PD transfer backend 'mooncake' needs the PyPI package mooncake-transfer-engine-non-cuda "
    "(or mooncake-transfer-engine on CUDA machines) and the system library libibverbs.so.1 "
    "(Debian/Ubuntu: apt-get install -y libibverbs1 ibverbs-providers); `make setup` installs both"
)


class DataPlane(Protocol):
    session_id: str

    def register(self, ranges: Sequence[tuple[int, int]]) -> None: ...

    def write(self, session_id: str, src: list[int], dst: list[int], lengths: list[int]) -> int: ...


def load_transfer_engine():
    """The mooncake TransferEngine class; RuntimeError with the install command when missing."""
    os.environ.setdefault("GLOG_minloglevel", "1")  # mooncake logs every connection at INFO
    try:
        from mooncake.engine import TransferEngine
    except ImportError as err:
        raise RuntimeError(f"{INSTALL_HINT} ({err})") from err
    return TransferEngine


class MooncakeDataPlane:
    def __init__(self, ip: str, ib_device: str | None = None):
        engine_cls = load_transfer_engine()
        self.engine = engine_cls()
        protocol = "rdma" if ib_device else "tcp"
        rc = self.engine.initialize(ip, "P2PHANDSHAKE", protocol, ib_device or "")
        if rc != 0:
            raise RuntimeError(f"mooncake transfer engine failed to start on {ip} ({protocol}): rc={rc}")
        self.session_id = f"{ip}:{self.engine.get_rpc_port()}"
        self.protocol = protocol

    def register(self, ranges: Sequence[tuple[int, int]]) -> None:
        ptrs = [p for p, _ in ranges]
        lens = [n for _, n in ranges]
        if ptrs and self.engine.batch_register_memory(ptrs, lens) != 0:
            raise RuntimeError(f"mooncake could not register {len(ptrs)} KV buffers ({sum(lens) / 2**20:.1f} MB)")

    def write(self, session_id: str, src: list[int], dst: list[int], lengths: list[int]) -> int:
        """Write the triples to `session_id`'s memory; 0 on success, the engine's error code else."""
        for i in range(0, len(src), MAX_BATCH_ENTRIES):
            j = i + MAX_BATCH_ENTRIES
            rc = self.engine.batch_transfer_sync_write(session_id, src[i:j], dst[i:j], lengths[i:j])
            if rc != 0:
                return rc
        return 0
