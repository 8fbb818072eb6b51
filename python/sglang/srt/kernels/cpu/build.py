"""Builds the CPU kernels (csrc/*.cpp) with the host C++ compiler on first use.

torch's extension loader compiles once per source text into its cache directory
(TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions) and holds a file lock while it does, so
several ranks starting together build it once. The code is compiled for the host CPU
(-march=native); the module name carries a hash of the CPU's feature flags so a cache shared by
different machines never loads a build for another instruction set, and a hash of the shared
headers (csrc/*.h), which torch's loader does not watch. `make setup` builds it ahead
(`python -m sglang.srt.kernels.cpu.build`), so the first server start does not wait.

`load()` returns the module, or None (with one warning) when there is no compiler or the build
fails: callers then keep their torch paths.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import threading
import time
from types import ModuleType
from typing import Optional

logger = logging.getLogger(__name__)

_CSRC = os.path.join(os.path.dirname(__file__), "csrc")
_SOURCES = [os.path.join(_CSRC, name) for name in ("sglang_cpu_ops.cpp", "prefill_attention_amx.cpp")]
_lock = threading.Lock()
_state: dict[str, Optional[ModuleType]] = {}


def _headers_tag() -> str:
    """Hash of csrc/*.h: torch's loader rebuilds when a listed source changes, not an included
    header, so the headers' text goes into the module name instead."""
    h = hashlib.sha1()
    for name in sorted(os.listdir(_CSRC)):
        if name.endswith(".h"):
            with open(os.path.join(_CSRC, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()[:8]


def _cpu_tag() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return hashlib.sha1(flags.encode()).hexdigest()[:8]


def _put_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the pip-installed one sits beside this interpreter, which a
    venv's python run by its path (`.venv/bin/python -m ...`) does not put on PATH."""
    if shutil.which("ninja") is None:
        bin_dir = os.path.dirname(sys.executable)
        if os.path.exists(os.path.join(bin_dir, "ninja")):
            os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def load() -> Optional[ModuleType]:
    """The compiled kernel module (built when needed), or None where it cannot be built."""
    with _lock:
        if "module" in _state:
            return _state["module"]
        module = None
        try:
            from torch.utils import cpp_extension

            _put_ninja_on_path()

            start = time.perf_counter()
            module = cpp_extension.load(
                name=f"sglang_cpu_ops_{_cpu_tag()}_{_headers_tag()}",
                sources=_SOURCES,
                extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-mprefer-vector-width=512"],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
            elapsed = time.perf_counter() - start
            if elapsed > 2.0:
                logger.info("built the CPU kernels in %.0f s", elapsed)
        except Exception as exc:  # no compiler / ninja, or a build error: keep the torch paths
            logger.warning("CPU kernels unavailable (%s: %s); using the torch implementations", type(exc).__name__, exc)
            module = None
        _state["module"] = module
        return module


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    module = load()
    print("CPU kernels:", "ready" if module is not None else "unavailable (torch fallbacks in use)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
