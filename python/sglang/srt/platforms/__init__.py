"""Device platforms: the one place that knows about CPU / CUDA / Ascend NPU differences.

    platform = get_platform(server_args.device)   # "cpu", "cuda" or "npu"
    platform = current_platform()                 # the best available one (npu > cuda > cpu)

Platforms are stateless and cheap; construct them where needed, nothing here is cached.
"""

from __future__ import annotations

from sglang.srt.platforms.base import AcceleratorPlatform, NullEvent, NullStream, Platform
from sglang.srt.platforms.cpu import CpuPlatform
from sglang.srt.platforms.cuda import CudaPlatform
from sglang.srt.platforms.npu import NpuPlatform

PLATFORMS: dict[str, type[Platform]] = {"cpu": CpuPlatform, "cuda": CudaPlatform, "npu": NpuPlatform}


def get_platform(name: str) -> Platform:
    """The platform called `name` ("cpu", "cuda", "npu"; a device string like "cuda:1" works too)."""
    key = str(name).split(":", 1)[0].lower()
    if key not in PLATFORMS:
        raise ValueError(f"unknown platform {name!r}; expected one of {sorted(PLATFORMS)}")
    return PLATFORMS[key]()


def current_platform() -> Platform:
    """The first available of npu, cuda, cpu."""
    for key in ("npu", "cuda"):
        if PLATFORMS[key].is_available():
            return PLATFORMS[key]()
    return CpuPlatform()


__all__ = [
    "AcceleratorPlatform",
    "CpuPlatform",
    "CudaPlatform",
    "NpuPlatform",
    "NullEvent",
    "NullStream",
    "PLATFORMS",
    "Platform",
    "current_platform",
    "get_platform",
]
