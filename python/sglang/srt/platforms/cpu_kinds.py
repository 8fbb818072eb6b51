"""CPU kinds and what `--dtype auto` is on each: the CPU's flags (/proc/cpuinfo, read once, with
SGLANG_CPU_FLAGS_OVERRIDE and the ISA caps ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY / SGLANG_CPU_ISA
applied), its vendor, and `choose_dtype`. The CPU platform (cpu.py) asks it and re-exports its
names."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from sglang.srt.kernels.cpu import isa as cpu_isa  # standard library only: the one ISA vocabulary
from sglang.srt.platforms import cpu_linears

# ---------------------------------------------------------------------------- dtype of `--dtype auto`
# CPU kinds, best first: what the bf16 GEMMs of oneDNN / torch run on (AMX tiles, AVX512-BF16,
# AVX-512 without BF16, AVX2, none of them). Not the kernels' ISAs (kernels/cpu/isa.py), but the
# flags of each kind are theirs.
CPU_KINDS = ("amx", "avx512-bf16", "avx512", "avx2", "generic")
# A representative flag set per kind (for SGLANG_CPU_FLAGS_OVERRIDE=<kind> and tests).
KIND_FLAGS: dict[str, frozenset[str]] = {"generic": frozenset({"sse2", "sse4_2"})}
KIND_FLAGS["avx2"] = KIND_FLAGS["generic"] | {"avx"} | set(cpu_isa.X86_ISAS["avx2"])
KIND_FLAGS["avx512"] = KIND_FLAGS["avx2"] | set(cpu_isa.X86_ISAS["avx512vnni"])
KIND_FLAGS["avx512-bf16"] = KIND_FLAGS["avx512"] | set(cpu_isa.X86_ISAS["avx512bf16"])
KIND_FLAGS["amx"] = KIND_FLAGS["avx512-bf16"] | {"amx_tile", "amx_bf16", "amx_int8"}
# the ISA names of the kinds' flag sets, accepted by SGLANG_CPU_FLAGS_OVERRIDE too
KIND_ALIASES = {"avx512bf16": "avx512-bf16", "avx512vnni": "avx512", "portable": "generic"}
_AVX512 = frozenset(f for f in KIND_FLAGS["amx"] if f.startswith(("avx512", "amx")))

# Where bf16 GEMMs are not native (AVX2 without the kernels' FMA bf16 linear, generic): the model
# runs in float32, and linears over at
# most this many tokens (one sequence decoding) read a bf16 copy of the weight instead (half the
# bytes; torch's bf16 fallback reads the weight once per row, so it loses from two rows on).
# Measured in docs/benchmarks.md ("--dtype auto on CPUs without native bf16").
BF16_GEMM_MAX_TOKENS = 1
# AVX-512 without AMX (with or without AVX512-BF16) and AVX2 with the kernels' FMA bf16 linear: bf16
# model, but linears over at least this many tokens run float32 GEMMs on float32 weight copies
# (oneDNN's bf16 GEMM is slower than float32 from ~32 rows on there; the kernels' FMA linear keeps
# the calls up to BF16_FMA_FLOAT32_MIN_ROWS / BF16_FMA_AVX2_FLOAT32_MIN_ROWS: cpu_linears.py).
FLOAT32_GEMM_MIN_TOKENS = 32


@dataclass(frozen=True)
class CpuDtypeChoice:
    """What `--dtype auto` runs on a CPU: `dtype` of weights / KV / activations, and, when
    `bf16_gemm_max_tokens` is set (float32 only), linears over at most that many tokens read a bf16
    copy of their weight (layers/linear_mixed.py)."""

    kind: str
    dtype: torch.dtype
    reason: str
    bf16_gemm_max_tokens: Optional[int] = None
    float32_gemm_min_tokens: Optional[int] = None

    @property
    def mode(self) -> str:
        name = str(self.dtype).replace("torch.", "")
        if self.bf16_gemm_max_tokens is not None:
            return f"{name} + bf16 weight copies for GEMMs of <= {self.bf16_gemm_max_tokens} token(s)"
        if self.float32_gemm_min_tokens is not None:
            return f"{name} + float32 weight copies for GEMMs of >= {self.float32_gemm_min_tokens} tokens"
        return name


@functools.lru_cache(maxsize=None)
def _proc_cpu_flags() -> Optional[frozenset[str]]:
    return cpu_isa.cpu_flags()  # the one reader of /proc/cpuinfo (a fact of the machine: read once)


def _flags_override(text: str) -> frozenset[str]:
    """SGLANG_CPU_FLAGS_OVERRIDE: a CPU kind name (amx, avx512-bf16, avx512, avx2, generic, or an
    ISA name of KIND_ALIASES) or a list of /proc/cpuinfo flags separated by spaces or commas."""
    text = text.strip().lower()
    text = KIND_ALIASES.get(text, text)
    if text in KIND_FLAGS:
        return KIND_FLAGS[text]
    return frozenset(text.replace(",", " ").split())


# ONEDNN_MAX_CPU_ISA values (oneDNN's names, lowercase) -> the kind they cap oneDNN at
_ONEDNN_CAPS = (
    ("avx512_core_amx", "amx"),
    ("avx10", "amx"),
    ("avx512_core_bf16", "avx512-bf16"),
    ("avx512_core", "avx512"),
    ("avx2", "avx2"),
    ("avx", "generic"),
    ("sse41", "generic"),
)


# SGLANG_CPU_ISA values below the best build -> the kind they cap the dtype choice at
_ISA_CAPS = {
    "avx512vnni": "avx512",
    "avx512": "avx512",
    "avx2vnni": "avx2",
    "avx2": "avx2",
    "portable": "generic",
}


def effective_cpu_flags() -> frozenset[str]:
    """The CPU flags the dtype choice goes by: /proc/cpuinfo (read once), or
    SGLANG_CPU_FLAGS_OVERRIDE; then without what SGLANG_CPU_ISA (avx512 / avx512vnni, avx2 /
    avx2vnni, portable), ONEDNN_MAX_CPU_ISA or ATEN_CPU_CAPABILITY keep our kernels / oneDNN / torch
    from using (so `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 SGLANG_CPU_ISA=avx2` on an
    AVX-512 machine is treated as the AVX2 machine it emulates)."""
    from sglang.srt import envs

    override = envs.SGLANG_CPU_FLAGS_OVERRIDE.get()
    flags = _flags_override(override) if override.strip() else (_proc_cpu_flags() or frozenset())
    caps = []
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().lower()
    if onednn and onednn not in ("all", "default"):
        caps += [kind for prefix, kind in _ONEDNN_CAPS if onednn.startswith(prefix)][:1]
    isa_cap = _ISA_CAPS.get(envs.SGLANG_CPU_ISA.get())
    # our kernels' ISA: a cap of its own only where oneDNN's is not given (avx512bf16, the best
    # build, caps nothing: it carries the AMX kernel, which checks for AMX at run time)
    if isa_cap is not None and not onednn:
        caps.append(isa_cap)
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()  # torch's own vectorised kernels
    if aten in ("avx2", "default"):
        caps.append("avx2" if aten == "avx2" else "generic")
    for cap in caps:
        flags = flags & KIND_FLAGS[cap] if cap == "generic" else flags - (_AVX512 - KIND_FLAGS[cap])
        if cap == "generic":
            flags = flags - {"avx2", "fma", "avx"}
    return frozenset(flags)


def cpu_kind(flags: Iterable[str]) -> str:
    """The CPU kind (CPU_KINDS) of a flag set."""
    f = set(flags)
    if {"amx_tile", "amx_bf16"} <= f:
        return "amx"
    if {"avx512f", "avx512_bf16"} <= f:
        return "avx512-bf16"
    if "avx512f" in f:
        return "avx512"
    if {"avx2", "fma"} <= f:
        return "avx2"
    return "generic"


@functools.lru_cache(maxsize=None)
def _proc_cpu_vendor() -> str:
    return cpu_isa.cpu_vendor()  # a fact of the machine: read once


# Vendors whose AVX512-BF16 dot product (vdpbf16ps) runs at about twice the float32 FMA rate, so
# oneDNN's bf16 GEMMs beat float32 at every size: AMD Zen 4 / Zen 5 (measured on Zen 5: packed
# bf16 4.7-5.5x float32 from 32 rows on, docs/notes/2026-11-step-breakdown.md). On the Intel Xeon
# measured without AMX it runs at half the FMA rate, hence FLOAT32_GEMM_MIN_TOKENS there.
FAST_BF16_DOT_VENDORS = frozenset({"AuthenticAMD"})
# the kinds whose packed bf16 linear is the kernels' FMA path, and the build answer it needs
FMA_BF16_IMPLS = {"avx512": "avx512-fma", "avx2": "avx2-fma"}
# ... and the rows from which their `--dtype auto` runs float32 copies (cpu_linears.py)
FMA_BF16_FLOAT32_MIN_ROWS = {
    "avx512": cpu_linears.BF16_FMA_FLOAT32_MIN_ROWS,
    "avx2": cpu_linears.BF16_FMA_AVX2_FLOAT32_MIN_ROWS,
}


def effective_cpu_vendor() -> str:
    """This CPU's vendor_id, or "" under SGLANG_CPU_FLAGS_OVERRIDE (an emulated kind has none)."""
    from sglang.srt import envs

    return "" if envs.SGLANG_CPU_FLAGS_OVERRIDE.get().strip() else _proc_cpu_vendor()


def fast_bf16_dot(kind: str, vendor: str) -> bool:
    """Whether bf16 dot products run faster than float32 FMAs on this CPU: AMX, or AVX512-BF16 of a
    FAST_BF16_DOT_VENDORS vendor."""
    return kind == "amx" or (kind == "avx512-bf16" and vendor in FAST_BF16_DOT_VENDORS)


def choose_dtype(
    flags: Optional[Iterable[str]] = None, vendor: Optional[str] = None, fma_bf16: bool = False
) -> CpuDtypeChoice:
    """`--dtype auto` on a CPU with these flags (default: effective_cpu_flags()) and vendor_id
    (default: this CPU's, or none under SGLANG_CPU_FLAGS_OVERRIDE: the override names an Intel-like
    kind). `fma_bf16`: the kernels' FMA bf16 linear runs here (`CpuPlatform.bf16_fma_kernels`)."""
    kind = cpu_kind(effective_cpu_flags() if flags is None else flags)
    if vendor is None:
        vendor = "" if flags is not None else effective_cpu_vendor()
    if kind == "amx":
        return CpuDtypeChoice(kind, torch.bfloat16, "AMX-BF16 tiles: native bf16 GEMMs")
    if fast_bf16_dot(kind, vendor):
        return CpuDtypeChoice(
            kind,
            torch.bfloat16,
            f"AVX512-BF16 on {vendor} (Zen 4 / Zen 5): bf16 dot products at twice the float32 FMA rate, "
            "native bf16 GEMMs at every size",
        )
    if fma_bf16 and kind in FMA_BF16_IMPLS:
        # emulated on a Zen 4 (docs/notes/2026-11-cpu-kind-dtype.md, 2026-11-30), SmolLM2, 2 threads:
        # AVX2 against float32 with one-row bf16 copies, decode b1 24 -> 14-15 ms, b8 66-71 -> 27 ms;
        # 2K prefill unchanged on both kinds (3.1-3.2 s)
        min_rows = FMA_BF16_FLOAT32_MIN_ROWS[kind]
        return CpuDtypeChoice(
            kind,
            torch.bfloat16,
            f"{'AVX2' if kind == 'avx2' else 'AVX-512 without BF16'} with the kernels' FMA bf16 linear (bf16 "
            "weights read once per call, widened in registers): bf16 wins decode (half the bytes), float32 "
            f"GEMMs from {min_rows} rows on",
            float32_gemm_min_tokens=min_rows,
        )
    if kind in ("avx512-bf16", "avx512"):
        what = (
            "AVX512-BF16 without AMX"
            if kind == "avx512-bf16"
            else "AVX-512 without BF16 (oneDNN converts bf16 in registers)"
        )
        return CpuDtypeChoice(
            kind,
            torch.bfloat16,
            f"{what}: bf16 wins decode (half the bytes), but oneDNN's bf16 GEMMs are slower than float32 "
            f"from ~{FLOAT32_GEMM_MIN_TOKENS} rows on, so prefill-sized linears run in float32",
            float32_gemm_min_tokens=FLOAT32_GEMM_MIN_TOKENS,
        )
    name = "AVX2" if kind == "avx2" else "no AVX2"
    return CpuDtypeChoice(
        kind,
        torch.float32,
        f"{name}, no native bf16 dot products: bf16 GEMMs run converting fallbacks (prefill 4-9x slower "
        "than float32), so float32 throughout, with bf16 weight copies for single-sequence decode (half the bytes)",
        bf16_gemm_max_tokens=BF16_GEMM_MAX_TOKENS,
    )
