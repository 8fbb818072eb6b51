"""The one instruction-set vocabulary and selector of the CPU kernels: both kernel homes obey it.

Instruction sets (ISAs), best first (the names of sgl-kernel-npu's DSA builds, the finer list):

    avx512bf16  AVX-512 + AVX512-BF16 + AVX512-VNNI (Cooper Lake, Sapphire / Emerald Rapids, Zen 4+)
    avx512vnni  AVX-512 + AVX512-VNNI without BF16 (Cascade Lake, Ice Lake)
    avx512      AVX-512 F / DQ / BW / VL (Skylake-SP and every AVX-512 CPU above)
    avx2vnni    AVX2 + FMA + AVX-VNNI (Alder Lake and later clients, Sierra Forest)
    avx2        AVX2 + FMA + F16C (AMD Zen 1-3, Haswell ... Skylake clients)
    portable    plain C++ (any CPU; the only one off x86)

`select()` turns a request (`SGLANG_CPU_ISA`: `auto` or a name; the old name `generic` is an alias of
`portable`) into the ISA to run: `auto` the best this CPU runs, a name that ISA, refused
(`IsaNotRunnable`) where the CPU lacks its flags (its instructions would kill the process with
SIGILL). Both kernel homes run the selected ISA:

- sglang's fused kernels (`kernels/cpu/csrc`, `loader.py`) are compiled once per BUILD (`BUILDS`:
  avx512bf16 (with the AMX prefill kernel, which checks for AMX at run time), avx512 (AVX-512 F / DQ /
  BW / VL only: no BF16 or AMX instruction), avx2, portable), each an extension module of its own
  (`_C_<build>`): an ISA runs the best build at or below it (`build_for`: avx512vnni -> avx512,
  avx2vnni -> avx2), so one install runs on any x86-64 CPU whatever the machine that compiled it;
  the avx512 and avx2 builds carry their int8 linear a second time, compiled for AVX512-VNNI /
  AVX-VNNI (`int8_linear_vnni`), which the avx512vnni / avx2vnni ISAs run (`loader.isa_has_vnni`);
- sgl-kernel-npu's DSA kernels (`sgl_kernel_npu.cpu`) have one translation unit per ISA, all in one
  extension, and run exactly the selected one.

Tests run every build / ISA the machine can run (an AMX machine checks the code AVX2-only ones run).
Standard library only: both `setup.py` files load this file by path, before anything is installed.
"""

from __future__ import annotations

import hashlib
import os
import platform as _platform
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

ENV = "SGLANG_CPU_ISA"
AUTO = "auto"

_AVX2_FLAGS = ("avx2", "fma", "f16c")
_AVX512_FLAGS = _AVX2_FLAGS + ("avx512f", "avx512dq", "avx512bw", "avx512vl")
# ISA -> the /proc/cpuinfo flags a CPU needs to run it; best first (x86-64)
X86_ISAS: dict[str, tuple[str, ...]] = {
    "avx512bf16": _AVX512_FLAGS + ("avx512_vnni", "avx512_bf16"),  # every CPU with avx512_bf16 has VNNI
    "avx512vnni": _AVX512_FLAGS + ("avx512_vnni",),
    "avx512": _AVX512_FLAGS,
    "avx2vnni": _AVX2_FLAGS + ("avx_vnni",),
    "avx2": _AVX2_FLAGS,
    "portable": (),
}
OTHER_ISAS: dict[str, tuple[str, ...]] = {"portable": ()}
# earlier names still accepted
ALIASES = {"generic": "portable"}


def has_vnni(name: str, machine: Optional[str] = None) -> bool:
    """Whether ISA `name` has int8 dot products (AVX512-VNNI or AVX-VNNI)."""
    return bool({"avx512_vnni", "avx_vnni"} & set(isas(machine)[parse(name, machine)]))


class IsaNotRunnable(ValueError):
    """The requested ISA needs flags this CPU does not have."""


def is_x86(machine: Optional[str] = None) -> bool:
    return (machine or _platform.machine()).lower() in ("x86_64", "amd64", "i686", "i386")


def isas(machine: Optional[str] = None) -> dict[str, tuple[str, ...]]:
    """The vocabulary of this architecture (name -> CPU flags needed), best first."""
    return X86_ISAS if is_x86(machine) else OTHER_ISAS


def parse(text: Optional[str], machine: Optional[str] = None) -> str:
    """`auto` or a vocabulary name (aliases resolved); ValueError naming SGLANG_CPU_ISA otherwise."""
    value = (text or "").strip().lower() or AUTO
    value = ALIASES.get(value, value)
    if value != AUTO and value not in isas(machine):
        choices = ", ".join([AUTO, *isas(machine), *ALIASES])
        raise ValueError(f"{ENV}={text!r} is not an instruction set; expected one of {choices}")
    return value


def requested(environ: Mapping[str, str] = os.environ) -> str:
    """The ISA SGLANG_CPU_ISA asks for (`auto` when unset)."""
    return parse(environ.get(ENV, AUTO))


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


def cpu_vendor(path: str = "/proc/cpuinfo") -> str:
    """The CPU's `vendor_id` (GenuineIntel, AuthenticAMD, ...), or "" where unknown."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def missing_flags(name: str, flags: Optional[Iterable[str]], machine: Optional[str] = None) -> list[str]:
    """The flags ISA `name` needs that `flags` lacks (all of them where the flags are unknown)."""
    need = isas(machine)[name]
    return sorted(set(need) - set(flags or ()))


def runnable_isas(flags: Optional[Iterable[str]] = None, machine: Optional[str] = None) -> list[str]:
    """The ISAs this CPU (or one with `flags`) runs, best first; unknown flags run `portable` only."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    return [name for name in isas(machine) if not missing_flags(name, flags, machine)]


def select(
    request: Optional[str] = None, flags: Optional[Iterable[str]] = None, machine: Optional[str] = None
) -> str:
    """The ISA to run: `request` (default: SGLANG_CPU_ISA) where this CPU runs it, the best it
    runs for `auto`; IsaNotRunnable for a named ISA the CPU cannot run."""
    name = parse(requested() if request is None else request, machine)
    flags = cpu_flags() if flags is None else frozenset(flags)
    if name == AUTO:
        return runnable_isas(flags, machine)[0]
    missing = missing_flags(name, flags, machine)
    if missing:
        raise IsaNotRunnable(f"this CPU cannot run the {name} kernels (missing {', '.join(missing)})")
    return name


# ---------------------------------------------------------------------------- sglang's own builds
PACKAGE = "sglang.srt.kernels.cpu"
CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
OPS_SOURCE, AMX_SOURCE, VEC_SOURCE = (
    "sglang_cpu_ops.cpp",
    "prefill_attention_amx.cpp",
    "prefill_attention_vec.cpp",
)
LINEAR_SOURCE = "linear_f32out_packed.cpp"
INT8_SOURCE = "int8_linear.cpp"
BF16_LINEAR_SOURCE = "bf16_linear.cpp"
KV_STORE_SOURCE = "kv_store.cpp"
COMMON_CFLAGS = ("-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math")
COMMON_LDFLAGS = ("-fopenmp",)


@dataclass(frozen=True)
class Variant:
    """One build of sglang's kernels, named by the ISA it needs. `with_amx`: whether it compiles
    the AMX prefill kernel (prefill_attention_amx.cpp; the others answer
    `prefill_attention_supported() == False` without compiling that file)."""

    name: str
    cflags: tuple[str, ...]
    cpu_flags: tuple[str, ...]  # the /proc/cpuinfo flags a CPU needs to run it: its ISA's
    with_amx: bool = False

    @property
    def sources(self) -> tuple[str, ...]:
        # prefill_attention_vec.cpp compiles to "unsupported" stubs without AVX2 / AVX-512
        common = (OPS_SOURCE, VEC_SOURCE, LINEAR_SOURCE, INT8_SOURCE, BF16_LINEAR_SOURCE, KV_STORE_SOURCE)
        return common + (AMX_SOURCE,) if self.with_amx else common

    def defines(self, tag: str) -> tuple[str, ...]:
        """-D flags: the build's name and the sources' tag (the module reports both), and whether
        the AMX file is part of it."""
        amx = ("-DSGLANG_WITH_AMX_SOURCE",) if self.with_amx else ()
        return (f"-DSGLANG_CPU_ISA={self.name}", f"-DSGLANG_CSRC_TAG={tag}") + amx

    @property
    def module(self) -> str:
        return f"{PACKAGE}._C_{self.name}"


_AVX2 = ("-mavx2", "-mfma", "-mf16c")
_AVX512 = _AVX2 + ("-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mprefer-vector-width=512")
# Best first. Only the avx512bf16 build may hold BF16 / AMX instructions (its AMX prefill kernel
# checks for AMX itself at run time: CPUID and the kernel's permission; so does the int8 linear's
# AMX-INT8 path).
_BF16_AMX = ("-mavx512bf16", "-mavx512vnni", "-mamx-tile", "-mamx-bf16", "-mamx-int8")
X86_VARIANTS: tuple[Variant, ...] = (
    Variant("avx512bf16", _AVX512 + _BF16_AMX, X86_ISAS["avx512bf16"], with_amx=True),
    Variant("avx512", _AVX512, X86_ISAS["avx512"]),
    Variant("avx2", _AVX2, X86_ISAS["avx2"]),
    # the portable loops only (no intrinsics), for baseline x86-64 (SSE2)
    Variant("portable", ("-march=x86-64",), ()),
)
# Other architectures: one build of the portable loops for the compiler's default target.
OTHER_VARIANTS: tuple[Variant, ...] = (Variant("portable", (), ()),)


def variants(machine: Optional[str] = None) -> tuple[Variant, ...]:
    """sglang's builds for this architecture, best first."""
    return X86_VARIANTS if is_x86(machine) else OTHER_VARIANTS


def variant(name: str, machine: Optional[str] = None) -> Variant:
    name = ALIASES.get(name, name)
    for v in variants(machine):
        if v.name == name:
            return v
    raise ValueError(
        f"unknown CPU kernel variant {name!r}; expected one of {[v.name for v in variants(machine)]}"
    )


def runnable(v: Variant, flags: Optional[Iterable[str]]) -> bool:
    """Whether a CPU with these flags executes every instruction of build v. Unknown flags
    (no /proc/cpuinfo) run only the build that needs none."""
    return not v.cpu_flags or (flags is not None and set(v.cpu_flags) <= set(flags))


def runnable_variants(flags: Optional[Iterable[str]] = None, machine: Optional[str] = None) -> list[Variant]:
    """The builds this CPU (or one with `flags`) can run, best first."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    return [v for v in variants(machine) if runnable(v, flags)]


def build_for(name: str, machine: Optional[str] = None) -> Variant:
    """The best build an ISA runs: the first whose CPU flags are all among the ISA's."""
    need = set(isas(machine)[parse(name, machine)])
    return next(v for v in variants(machine) if set(v.cpu_flags) <= need)


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
    """The builds to compile: all of them, or the comma-separated names in `text`
    (SGLANG_CPU_KERNEL_VARIANTS, e.g. to build only `portable` in a quick test)."""
    if not text or not text.strip():
        return variants(machine)
    return tuple(variant(name.strip(), machine) for name in text.split(",") if name.strip())
