"""Loads the CPU kernels that `setup.py` compiled at install time; never compiles anything.

The kernels are extension modules built by `pip install -e .` / `make setup` (one per build of the
ISA vocabulary, `isa.py`). Loading is an import: nothing waits on a compiler or a lock, so a
server, engine or test starts in the same time whether or not a build was ever interrupted.

`load()` returns the module of the build the selected ISA runs (`isa.select`: SGLANG_CPU_ISA, or the
best ISA this CPU runs; `isa.build_for`: avx512vnni runs the avx512 build, avx2vnni the avx2 one),
falling back to a lesser built one for `auto`, or None with one warning saying why and how to build
it: not built, built from other sources than csrc/ holds now (an edit since the last build), or an
ISA this CPU cannot execute. Callers then keep their torch code.
`python -m sglang.srt.kernels.cpu.loader` prints what this machine has.
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

# imported modules per build (an import result, like sys.modules: the same for the whole process)
_lock = threading.Lock()
_loaded: dict[str, "LoadResult"] = {}


@dataclass(frozen=True)
class LoadResult:
    """A build's module, or None and the reason it is not usable."""

    variant: str
    module: Optional[ModuleType]
    reason: str = ""


def _import(v: isa.Variant) -> LoadResult:
    try:
        module = importlib.import_module(v.module)
    except ImportError as exc:
        return LoadResult(v.name, None, f"the {v.name} build is not built ({exc}); {BUILD_HINT}")
    built_from, now = module.source_tag(), isa.source_tag()
    if built_from != now:
        return LoadResult(
            v.name,
            None,
            f"the {v.name} build is older than the sources in csrc/ (built from {built_from}, now {now}); {BUILD_HINT}",
        )
    return LoadResult(v.name, module)


def load_variant(name: str, flags: Optional[frozenset[str]] = None) -> LoadResult:
    """The module of build `name` (cached per process); refuses a build this CPU cannot run
    (its instructions would kill the process with SIGILL)."""
    v = isa.variant(name)
    flags = isa.cpu_flags() if flags is None else flags
    if not isa.runnable(v, flags):
        missing = sorted(set(v.cpu_flags) - set(flags or ()))
        return LoadResult(
            v.name,
            None,
            f"this CPU cannot run the {v.name} build (missing {', '.join(missing) or 'CPU flags'})",
        )
    with _lock:
        if v.name not in _loaded:
            _loaded[v.name] = _import(v)
        return _loaded[v.name]


def choose(flags: Optional[frozenset[str]] = None) -> LoadResult:
    """The build of SGLANG_CPU_ISA's ISA when set (not `auto`), else the best built one this CPU runs."""
    wanted = envs.SGLANG_CPU_ISA.get()
    flags = isa.cpu_flags() if flags is None else flags
    if wanted != isa.AUTO:
        try:
            isa.select(wanted, flags)
        except isa.IsaNotRunnable as exc:
            return LoadResult(wanted, None, f"{isa.ENV}={wanted}: {exc}")
        return load_variant(isa.build_for(wanted).name, flags)
    reasons = []
    for v in isa.runnable_variants(flags):
        result = load_variant(v.name, flags)
        if result.module is not None:
            if reasons:  # a better build exists for this CPU but is missing
                logger.warning("CPU kernels: using the %s build; %s", v.name, "; ".join(reasons))
            return result
        reasons.append(result.reason)
    return LoadResult("none", None, "; ".join(reasons) or "no kernel build for this CPU")


def isa_has_vnni(flags: Optional[frozenset[str]] = None) -> bool:
    """Whether the ISA the kernels run (SGLANG_CPU_ISA, or the best this CPU runs) has AVX512-VNNI
    or AVX-VNNI: then the int8 linear's VNNI copy runs where the build carries one."""
    try:
        name = isa.select(envs.SGLANG_CPU_ISA.get(), isa.cpu_flags() if flags is None else flags)
    except isa.IsaNotRunnable:
        return False
    return isa.has_vnni(name)


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
    print(f"ISAs this CPU runs (best first): {', '.join(isa.runnable_isas(flags))}")
    for v in isa.variants():
        if not isa.runnable(v, flags):
            print(f"  {v.name:10s} not runnable on this CPU")
            continue
        r = load_variant(v.name, flags)
        print(f"  {v.name:10s} {'ready' if r.module is not None else r.reason}")
    vnni = "yes" if isa_has_vnni(flags) else "no"
    print(f"ISA in use ({isa.ENV}={envs.SGLANG_CPU_ISA.get()}): the int8 linear's VNNI copy: {vnni}")
    chosen = choose(flags)
    print(
        "CPU kernels:",
        f"{chosen.variant} build in use"
        if chosen.module is not None
        else "unavailable (torch fallbacks in use)",
    )
    return 0 if chosen.module is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
