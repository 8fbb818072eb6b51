"""Instruction-set variants of the CPU kernels: what each is compiled with and which CPUs run it.

The kernels are built once per variant at install time (`setup.py`, `make setup`), each an
extension module of its own (`_C_avx512`, `_C_avx2`, `_C_generic`), so one install runs on any
x86-64 CPU whatever the machine that compiled it: the loader (`build.py`) imports the best
variant this CPU can execute, and tests run every variant the CPU can execute (an AVX-512 / AMX
machine checks the AVX2 and generic code that AVX2-only machines run).

Standard library only: `setup.py` loads this file by path, before the package is installed.
"""

from __future__ import annotations

import hashlib
import os
import platform as _platform
from dataclasses import dataclass
from typing import Iterable, Optional

PACKAGE = "sglang.srt.kernels.cpu"
CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
OPS_SOURCE, AMX_SOURCE, VEC_SOURCE = "sglang_cpu_ops.cpp", "prefill_attention_amx.cpp", "prefill_attention_vec.cpp"
LINEAR_SOURCE = "linear_f32out_packed.cpp"
COMMON_CFLAGS = ("-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math")
COMMON_LDFLAGS = ("-fopenmp",)


@dataclass(frozen=True)
class Variant:
    """One build of the kernels. `cpu_flags`: the /proc/cpuinfo flags a CPU needs to run it;
    `with_amx`: whether it compiles the AMX prefill kernel (prefill_attention_amx.cpp; the
    others answer `prefill_attention_supported() == False` without compiling that file)."""

    name: str
    cflags: tuple[str, ...]
    cpu_flags: tuple[str, ...]
    with_amx: bool = False

    @property
    def sources(self) -> tuple[str, ...]:
        # prefill_attention_vec.cpp compiles to "unsupported" stubs without AVX2 / AVX-512
        common = (OPS_SOURCE, VEC_SOURCE, LINEAR_SOURCE)
        return common + (AMX_SOURCE,) if self.with_amx else common

    def defines(self, tag: str) -> tuple[str, ...]:
        """-D flags: the variant's name and the sources' tag (the module reports both), and
        whether the AMX file is part of it."""
        amx = ("-DSGLANG_WITH_AMX_SOURCE",) if self.with_amx else ()
        return (f"-DSGLANG_CPU_ISA={self.name}", f"-DSGLANG_CSRC_TAG={tag}") + amx

    @property
    def module(self) -> str:
        return f"{PACKAGE}._C_{self.name}"


_AVX2 = ("-mavx2", "-mfma", "-mf16c")
# Best first. The AVX-512 build also carries the AMX prefill kernel, which checks for AMX
# itself at run time (CPUID and the kernel's permission), so an AVX-512 CPU without AMX runs it.
X86_VARIANTS: tuple[Variant, ...] = (
    Variant(
        "avx512",
        _AVX2 + ("-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx512bf16",
                 "-mamx-tile", "-mamx-bf16", "-mprefer-vector-width=512"),
        ("avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_bf16"),
        with_amx=True,
    ),
    Variant("avx2", _AVX2, ("avx2", "fma", "f16c")),
    # the portable loops only (no intrinsics), for baseline x86-64 (SSE2)
    Variant("generic", ("-march=x86-64",), ()),
)  # fmt: skip
# Other architectures: one build of the portable loops for the compiler's default target.
OTHER_VARIANTS: tuple[Variant, ...] = (Variant("generic", (), ()),)


def is_x86(machine: Optional[str] = None) -> bool:
    return (machine or _platform.machine()).lower() in ("x86_64", "amd64", "i686", "i386")


def variants(machine: Optional[str] = None) -> tuple[Variant, ...]:
    """The variants built for this architecture, best first."""
    return X86_VARIANTS if is_x86(machine) else OTHER_VARIANTS


def variant(name: str, machine: Optional[str] = None) -> Variant:
    for v in variants(machine):
        if v.name == name:
            return v
    raise ValueError(f"unknown CPU kernel variant {name!r}; expected one of {[v.name for v in variants(machine)]}")


def cpu_flags(path: str = "/proc/cpuinfo") -> Optional[frozenset[str]]:
    """The CPU's feature flags (the first `flags` line of /proc/cpuinfo), or None where unknown."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return None


def runnable(v: Variant, flags: Optional[Iterable[str]]) -> bool:
    """Whether a CPU with these flags executes every instruction of variant v. Unknown flags
    (no /proc/cpuinfo) run only the variant that needs none."""
    if not v.cpu_flags:
        return True
    return flags is not None and set(v.cpu_flags) <= set(flags)


def runnable_variants(flags: Optional[Iterable[str]] = None, machine: Optional[str] = None) -> list[Variant]:
    """The variants this CPU (or one with `flags`) can run, best first."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    return [v for v in variants(machine) if runnable(v, flags)]


def source_tag(csrc: str = CSRC) -> str:
    """Hash of every .cpp / .h file of csrc: compiled into each module, so that a build older
    than the sources it was made from is recognised instead of loaded."""
    h = hashlib.sha1()
    for name in sorted(os.listdir(csrc)):
        if name.endswith((".cpp", ".h")):
            with open(os.path.join(csrc, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()[:16]


def selected_variants(text: Optional[str], machine: Optional[str] = None) -> tuple[Variant, ...]:
    """The variants to build: all of them, or the comma-separated names in `text`
    (SGLANG_CPU_KERNEL_VARIANTS, e.g. to build only `generic` in a quick test)."""
    if not text or not text.strip():
        return variants(machine)
    return tuple(variant(name.strip(), machine) for name in text.split(",") if name.strip())
