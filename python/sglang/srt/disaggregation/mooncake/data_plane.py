"""The data plane: who moves KV bytes between two servers' registered memory.

`MooncakeDataPlane` wraps the PyPI `mooncake-transfer-engine` (the non-CUDA build on CPU
machines): P2P handshake (no metadata server), TCP transport, or RDMA when
`--disaggregation-ib-device` names NICs. Memory is registered once (the whole KV pool); a write
is a batch of (local address, remote address, bytes) triples, page runs rather than tokens.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Optional, Protocol, Sequence

from sglang.srt.mem_cache.transfer_layout import KVRegion, registration_ranges

logger = logging.getLogger(__name__)

# Mooncake's TCP transport queues at most ~2K transfers per peer and rejects a batch past that
# ("TCP lane queue-full", rc -1; measured: 2049 entries pass, 3000 fail), shared by every transfer
# thread writing to that peer. Batches stay well under it, and a rejected batch is resent in
# smaller batches after a back-off before the transfer is failed.
MAX_BATCH_ENTRIES = 256  # x SGLANG_DISAGGREGATION_QUEUE_SIZE (4) transfer threads: 1K in flight
MIN_BATCH_ENTRIES = 32
MAX_RETRY_DELAY_S = 0.5  # back-offs 5 ms .. 0.64 s, about 1.3 s in all, before the transfer fails

# PD is an optional part of an install (`make setup` leaves it out where libibverbs cannot be had)
SYSTEM_FIX = "sudo apt-get install -y libibverbs1 ibverbs-providers"
PACKAGES_FIX = "pip install mooncake-transfer-engine-non-cuda sglang-router"  # the `pd` extra of setup.py


def install_hint(err: BaseException) -> str:
    """What a PD server refuses to start with when mooncake cannot be imported: the exact command."""
    missing_package = isinstance(err, ModuleNotFoundError) and (err.name or "").split(".")[0] == "mooncake"
    if missing_package:
        fix = f"`{PACKAGES_FIX}` (in a checkout: `make setup-pd`; CUDA machines: mooncake-transfer-engine)"
    else:
        fix = f"`{SYSTEM_FIX}` (Debian/Ubuntu, as root), then `make setup-pd` in a checkout"
    return (
        f"PD disaggregation (--disaggregation-transfer-backend mooncake) is not set up on this machine: "
        f"mooncake's transfer engine cannot be loaded ({type(err).__name__}: {err}). Fix: {fix}"
    )


class DataPlane(Protocol):
    session_id: str

    def register(self, ranges: Sequence[tuple[int, int]]) -> None: ...

    def write(self, session_id: str, src: list[int], dst: list[int], lengths: list[int]) -> int: ...


def load_transfer_engine():
    """The mooncake TransferEngine class; RuntimeError with the command that fixes it when it cannot
    be loaded (the package absent, or the system library libibverbs.so.1 it loads even for TCP)."""
    os.environ.setdefault("GLOG_minloglevel", "1")  # mooncake logs every connection at INFO
    try:
        from mooncake.engine import TransferEngine
    except (ImportError, OSError) as err:
        raise RuntimeError(install_hint(err)) from err
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
            raise RuntimeError(
                f"mooncake could not register {len(ptrs)} KV buffers ({sum(lens) / 2**20:.1f} MB)"
            )

    def write(self, session_id: str, src: list[int], dst: list[int], lengths: list[int]) -> int:
        """Write the triples to `session_id`'s memory; 0 on success, the engine's error code else."""
        for i in range(0, len(src), MAX_BATCH_ENTRIES):
            j = i + MAX_BATCH_ENTRIES
            rc = self._write_batch(session_id, src[i:j], dst[i:j], lengths[i:j])
            if rc != 0:
                return rc
        return 0

    def _write_batch(self, session_id: str, src: list[int], dst: list[int], lengths: list[int]) -> int:
        """One batch; a rejected one (the peer's queue full: the accepted part of the rejected
        batch, or other threads' batches, still draining) is resent in smaller batches after a
        short back-off. Writes are idempotent, so resending entries that did land is harmless."""
        size = cap = len(src)
        done, delay = 0, 0.005
        while done < len(src):
            j = done + size
            rc = self.engine.batch_transfer_sync_write(session_id, src[done:j], dst[done:j], lengths[done:j])
            if rc == 0:
                done, delay = j, 0.005
                size = min(size * 2, cap)
                continue
            if delay > MAX_RETRY_DELAY_S:
                return rc
            logger.debug(
                "mooncake batch of %d entries to %s rejected (rc %d); retrying", size, session_id, rc
            )
            time.sleep(delay)
            delay *= 2
            cap = max(MIN_BATCH_ENTRIES, size // 2)
            size = MIN_BATCH_ENTRIES  # small batches pass while the queue drains; grow again up to `cap`
        return 0


def start_data_plane(ip: str, ib_device: Optional[str], regions: Sequence[KVRegion]) -> MooncakeDataPlane:
    """A transfer engine on `ip` with this rank's whole KV pool registered once."""
    plane = MooncakeDataPlane(ip, ib_device)
    plane.register(registration_ranges(regions))
    logger.info(
        "PD: mooncake %s transfer engine at %s, %d KV buffers registered (%.1f MB)",
        plane.protocol,
        plane.session_id,
        len(regions),
        sum(r.nbytes for r in regions) / 2**20,
    )
    return plane
