"""Loads the CPU kernels that `setup.py` compiled at install time; never compiles anything.

The kernels are extension modules built by `pip install -e .` / `make setup` (one per
instruction-set variant, `isa.py`). Loading is an import: nothing waits on a compiler or a lock,
so a server, engine or test starts in the same time whether or not a build was ever interrupted.

`load()` returns the module of the best variant this CPU runs (or the one SGLANG_CPU_ISA names),
or None with one warning saying why and how to build it: not built, built from other sources than
csrc/ holds now (an edit since the last build), or a variant this CPU cannot execute. Callers then
keep their torch code. `python -m sglang.srt.kernels.cpu.loader` prints what this machine has.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Optional

import torch  # noqa: F401  (loads libtorch / libc10, which the extension modules link against)

from sglang.srt import envs
from sglang.srt.kernels.cpu import isa

logger = logging.getLogger(__name__)

BUILD_HINT = "build them with `make setup` (or `pip install --no-build-isolation -e .`, `python setup.py build_ext --inplace`)"

_lock = threading.Lock()
_loaded: dict[str, "LoadResult"] = {}


@dataclass(frozen=True)
class LoadResult:
    """A variant's module, or None and the reason it is not usable."""

    variant: str
    module: Optional[ModuleType]
    reason: str = ""


def _import(v: isa.Variant) -> LoadResult:
    try:
        module = importlib.import_module(v.module)
    except ImportError as exc:
        return LoadResult(v.name, None, f"the {v.name} variant is not built ({exc}); {BUILD_HINT}")
    built_from, now = module.source_tag(), isa.source_tag()
    if built_from != now:
        return LoadResult(
            v.name, None, f"the {v.name} build is older than the sources in csrc/ (built from {built_from}, now {now}); {BUILD_HINT}"
        )
    return LoadResult(v.name, module)


def load_variant(name: str, flags: Optional[frozenset[str]] = None) -> LoadResult:
    """The module of variant `name` (cached per process); refuses a variant this CPU cannot run
    (its instructions would kill the process with SIGILL)."""
    v = isa.variant(name)
    flags = isa.cpu_flags() if flags is None else flags
    if not isa.runnable(v, flags):
        missing = sorted(set(v.cpu_flags) - set(flags or ()))
        return LoadResult(name, None, f"this CPU cannot run the {name} variant (missing {', '.join(missing) or 'CPU flags'})")
    with _lock:
        if name not in _loaded:
            _loaded[name] = _import(v)
        return _loaded[name]


def choose(flags: Optional[frozenset[str]] = None) -> LoadResult:
    """SGLANG_CPU_ISA's variant when set (not `auto`), else the best built variant this CPU runs."""
    wanted = envs.SGLANG_CPU_ISA.get()
    if wanted != "auto":
        return load_variant(wanted, flags)
    reasons = []
    for v in isa.runnable_variants(flags):
        result = load_variant(v.name, flags)
        if result.module is not None:
            if reasons:  # a better variant exists for this CPU but is missing
                logger.warning("CPU kernels: using the %s variant; %s", v.name, "; ".join(reasons))
            return result
        reasons.append(result.reason)
    return LoadResult("none", None, "; ".join(reasons) or "no kernel variant for this CPU")


_warned: set[str] = set()


def load() -> Optional[ModuleType]:
    """The kernel module for this CPU, or None (one warning per reason): callers use torch code."""
    result = choose()
    if result.module is None and result.reason not in _warned:
        _warned.add(result.reason)
        logger.warning("CPU kernels unavailable, using the torch implementations: %s", result.reason)
    return result.module


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    flags = isa.cpu_flags()
    print(f"sources: {isa.source_tag()}")
    for v in isa.variants():
        if not isa.runnable(v, flags):
            print(f"  {v.name:8s} not runnable on this CPU")
            continue
        r = load_variant(v.name, flags)
        print(f"  {v.name:8s} {'ready' if r.module is not None else r.reason}")
    chosen = choose(flags)
    print("CPU kernels:", f"{chosen.variant} variant in use" if chosen.module is not None else "unavailable (torch fallbacks in use)")
    return 0 if chosen.module is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
