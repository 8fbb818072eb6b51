"""The platform registry: the platform classes by device family and this process's platform objects
(re-exported by the package, see its docstring)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from sglang.srt.platforms.base import AcceleratorPlatform, NullEvent, NullStream, Platform
from sglang.srt.platforms.cpu import CpuPlatform
from sglang.srt.platforms.cuda import CudaPlatform
from sglang.srt.platforms.npu import NpuPlatform

PLATFORMS: dict[str, type[Platform]] = {"cpu": CpuPlatform, "cuda": CudaPlatform, "npu": NpuPlatform}


class PlatformRegistry:
    """The platform objects of a process, one per device family, by the names asked for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[Any, Platform] = {}

    def get(self, name: Any) -> Platform:
        found = self._by_name.get(name)
        return found if found is not None else self._create(name)

    def _create(self, name: Any) -> Platform:
        key = str(name).split(":", 1)[0].lower()
        if key not in PLATFORMS:
            raise ValueError(f"unknown platform {name!r}; expected one of {sorted(PLATFORMS)}")
        with self._lock:
            platform = self._by_name.get(key)
            if platform is None:
                platform = self._by_name[key] = PLATFORMS[key]()
            self._by_name[name] = platform
        return platform

    @contextlib.contextmanager
    def fresh(self) -> Iterator[None]:
        """New platform objects inside the block; the ones before it back after it."""
        with self._lock:
            saved, self._by_name = self._by_name, {}
        try:
            yield
        finally:
            with self._lock:
                self._by_name = saved


_PROCESS = PlatformRegistry()


def get_platform(name: Any) -> Platform:
    """This process's platform called `name` ("cpu", "cuda", "npu"; a device string like "cuda:1" works too)."""
    return _PROCESS.get(name)


def current_platform() -> Platform:
    """The first available of npu, cuda, cpu."""
    for key in ("npu", "cuda"):
        if PLATFORMS[key].is_available():
            return get_platform(key)
    return get_platform("cpu")


def fresh_platforms() -> contextlib.AbstractContextManager[None]:
    """Inside the block `get_platform` creates new platform objects (an empty kernel table, no
    `--dtype auto` choice: what a new process starts with); after it the earlier ones are back.
    For tests that change SGLANG_CPU_KERNELS, SGLANG_CPU_ISA or SGLANG_CPU_FLAGS_OVERRIDE."""
    return _PROCESS.fresh()
