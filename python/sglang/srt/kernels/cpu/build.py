"""Builds the CPU kernels (csrc/*.cpp) with the host C++ compiler on first use.

torch's extension loader compiles once per source text into its cache directory
(TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions) and holds a file lock while it does, so
several ranks starting together build it once. The code is compiled for the host CPU
(-march=native); the module name carries a hash of the CPU's feature flags so a cache shared by
different machines never loads a build for another instruction set, and a hash of the shared
headers (csrc/*.h), which torch's loader does not watch. `make setup` builds it ahead
(`python -m sglang.srt.kernels.cpu.build`), so the first server start does not wait.

Two guards around torch's loader: the sources are copied into the build directory first (only
when their text changed), so every checkout of the code shares one build instead of rebuilding
whenever another checkout's paths were the last written into build.ninja; and the build runs
under an `flock` of ours, which the kernel releases when a process dies, so a `lock` file that
torch left behind in a build that was killed (Ctrl-C during the first start) is known to be stale
and removed instead of making every later start wait forever.

`load()` returns the module, or None (with one warning) when there is no compiler or the build
fails: callers then keep their torch paths.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import sys
import threading
import time
from types import ModuleType
from typing import Iterator, Optional

logger = logging.getLogger(__name__)

_CSRC = os.path.join(os.path.dirname(__file__), "csrc")
_SOURCES = ("sglang_cpu_ops.cpp", "prefill_attention_amx.cpp")
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


def copy_sources(src_dir: str, dst_dir: str) -> list[str]:
    """Copy csrc's .cpp / .h files into dst_dir, rewriting only those whose text differs (an
    unchanged file keeps its mtime, so ninja does not rebuild); returns the .cpp paths to build."""
    os.makedirs(dst_dir, exist_ok=True)
    for name in sorted(os.listdir(src_dir)):
        if not name.endswith((".cpp", ".h")):
            continue
        with open(os.path.join(src_dir, name), "rb") as f:
            text = f.read()
        dst = os.path.join(dst_dir, name)
        try:
            with open(dst, "rb") as f:
                same = f.read() == text
        except OSError:
            same = False
        if not same:
            tmp = f"{dst}.tmp{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(text)
            os.replace(tmp, dst)
    return [os.path.join(dst_dir, name) for name in _SOURCES]


@contextlib.contextmanager
def exclusive_build(build_dir: str) -> Iterator[None]:
    """Hold this machine's build lock of `build_dir` (an flock, freed by the kernel when its
    holder dies). Inside it nobody else is building, so torch's own `lock` file, if present, was
    left by a killed build: remove it (torch would otherwise wait for it forever)."""
    os.makedirs(build_dir, exist_ok=True)
    with open(os.path.join(build_dir, "sglang-build.flock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            stale = os.path.join(build_dir, "lock")
            if os.path.exists(stale):
                logger.warning("removing %s, left by a CPU-kernel build that was killed", stale)
                os.remove(stale)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
            name = f"sglang_cpu_ops_{_cpu_tag()}_{_headers_tag()}"
            build_dir = cpp_extension._get_build_directory(name, False)
            with exclusive_build(build_dir):
                module = cpp_extension.load(
                    name=name,
                    sources=copy_sources(_CSRC, os.path.join(build_dir, "src")),
                    extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-mprefer-vector-width=512"],
                    extra_ldflags=["-fopenmp"],
                    build_directory=build_dir,
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
