"""CPU platform: gloo, no streams, memory from /proc/meminfo."""

from __future__ import annotations

import os
from typing import Any, ContextManager

import torch

from sglang.srt.platforms.base import NullEvent, NullStream, Platform, null_stream_context


def read_meminfo(path: str = "/proc/meminfo") -> tuple[int, int]:
    """(available_bytes, total_bytes) from a Linux meminfo file; falls back to sysconf."""
    fields: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    fields[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    if "MemTotal" in fields:
        free = fields.get("MemAvailable", fields.get("MemFree", 0))
        return free, fields["MemTotal"]
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"

    @classmethod
    def is_available(cls) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def device(self, local_rank: int = 0) -> torch.device:
        return torch.device("cpu")

    def set_device(self, local_rank: int = 0) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def memory_info(self, local_rank: int = 0) -> tuple[int, int]:
        return read_meminfo()

    def current_stream(self) -> Any:
        return NullStream()

    def new_stream(self) -> Any:
        return NullStream()

    def stream(self, stream: Any) -> ContextManager:
        return null_stream_context(stream)

    def new_event(self, enable_timing: bool = False) -> Any:
        return NullEvent()
