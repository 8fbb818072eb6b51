"""The configuration of the HiCache `mooncake` storage backend (docs/hicache.md), with upstream's
names: each key is read from `--hicache-storage-backend-extra-config`, else from upstream's
environment variable, else its default. Only `master_server_address` (`MOONCAKE_MASTER`) is
required. Nothing here imports Mooncake, so the flags are checked before the engine starts.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

GIB, MIB = 1 << 30, 1 << 20

# extra-config key -> upstream's environment variable (the fallback)
ENV_NAMES = {
    "master_server_address": "MOONCAKE_MASTER",
    "metadata_server": "MOONCAKE_TE_META_DATA_SERVER",
    "protocol": "MOONCAKE_PROTOCOL",
    "device_name": "MOONCAKE_DEVICE",
    "local_hostname": "MOONCAKE_LOCAL_HOSTNAME",
    "global_segment_size": "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "local_buffer_size": "MOONCAKE_LOCAL_BUFFER_SIZE",
}
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": MIB, "mb": MIB, "mib": MIB}
_UNITS.update({"g": GIB, "gb": GIB, "gib": GIB})


@dataclass(frozen=True)
class MooncakeConfig:
    """How a rank joins the Mooncake store. `global_segment_size`: the memory this rank lends to
    the store (0: none; its pages then live in other clients' segments); `local_buffer_size`: the
    client's staging buffer (raised to hold a few storage pages); `retry_interval_s` (ours): how
    long the backend is skipped (every lookup a miss) after the master was found unreachable."""

    master_server_address: str
    metadata_server: str = "P2PHANDSHAKE"
    protocol: str = "tcp"
    device_name: str = ""
    local_hostname: str = "localhost"
    global_segment_size: int = 4 * GIB
    local_buffer_size: int = 16 * MIB
    retry_interval_s: float = 10.0

    def master_host_port(self) -> tuple[str, int]:
        host, _, port = self.master_server_address.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)


def parse_size(value: Any, key: str) -> int:
    """Bytes from an int or a string such as "4gb", "512 MiB", "1048576"."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = m and _UNITS.get(m.group(2).lower())
        if not m or unit is None:
            raise ValueError(f"mooncake {key} must be a size such as 4gb or 16777216, got {value!r}")
        size = int(float(m.group(1)) * unit)
    if size < 0:
        raise ValueError(f"mooncake {key} must be >= 0, got {value!r}")
    return size


def mooncake_config(extra: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> MooncakeConfig:
    """The backend's config from the extra-config JSON object and the environment; a ValueError
    naming the key when the master address is missing or a value does not parse."""
    given = {k: extra[k] if k in extra else environ.get(env) for k, env in ENV_NAMES.items()}
    given = {k: v for k, v in given.items() if v not in (None, "")}
    if "master_server_address" not in given:
        raise ValueError(
            "--hicache-storage-backend mooncake needs the master's address: master_server_address in "
            "--hicache-storage-backend-extra-config (or MOONCAKE_MASTER), e.g. 10.0.0.1:50051"
        )
    if not re.fullmatch(r".+:\d+", str(given["master_server_address"])):
        raise ValueError(
            f"mooncake master_server_address must be host:port, got {given['master_server_address']!r}"
        )
    for key in ("global_segment_size", "local_buffer_size"):
        if key in given:
            given[key] = parse_size(given[key], key)
    if "retry_interval_s" in extra:
        given["retry_interval_s"] = float(extra["retry_interval_s"])
    return MooncakeConfig(**{k: (v if isinstance(v, (int, float)) else str(v)) for k, v in given.items()})
