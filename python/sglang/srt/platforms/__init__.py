"""Device platforms: the one place that knows about CPU / CUDA / Ascend NPU differences.

    platform = get_platform(server_args.device)   # "cpu", "cuda" or "npu"
    platform = current_platform()                 # the best available one (npu > cuda > cpu)

A process has one platform object per device family, created on first use (at start-up, by
`rank_device.bind_rank`) and kept: it holds the process's device state, the kernel table
(`Platform.kernels`: the fused kernel build, loaded once) and, on CPU, the `--dtype auto` choice.
`fresh_platforms()` gives a block new ones (what a new process would create), for tests that change
the SGLANG_CPU_* variables those answers depend on. Constructing a platform class directly gives a
private object with state of its own.

The package imports torch only when one of these names is first used (`registry.py`), so a
process that only asks how to start its children (`launch_defaults.py`) stays torch-free.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "AcceleratorPlatform",
    "CpuPlatform",
    "CudaPlatform",
    "NpuPlatform",
    "NullEvent",
    "NullStream",
    "PLATFORMS",
    "Platform",
    "PlatformRegistry",
    "current_platform",
    "fresh_platforms",
    "get_platform",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("sglang.srt.platforms.registry"), name)
    globals()[name] = value
    return value
