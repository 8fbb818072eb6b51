"""Fused CPU implementation of the DSA ops (csrc/cpu, built at install time).

The instruction set is SGLang's one selector's choice (sglang/srt/kernels/cpu/isa.py, which also
picks the build of SGLang's own CPU kernels): `SGLANG_CPU_ISA=avx512bf16|avx512vnni|avx512|
avx2vnni|avx2|portable` (alias `generic` = portable) runs that one (an ISA the CPU lacks is refused),
`auto` or unset the best this CPU runs (AVX-512 with BF16 and VNNI, else AVX-512 with VNNI, else
AVX-512, else AVX2 + FMA with AVX-VNNI, else AVX2 + FMA, else the portable build). `force_isa()` does
the same for one block of code (tests run every path the machine can). Without SGLang installed the
extension picks the best one itself. Inputs are float32 or bfloat16; outputs are float32 (the
callers cast). The indexer's key rows are used in their own dtype (a bf16 index-key cache is read
as bf16, never copied to float32); with bf16 scoring (`score_dtype=torch.bfloat16`, or bf16 query
and keys) q and k are rounded to bf16 and multiplied in pairs with float32 sums (`vdpbf16ps` on
the avx512bf16 build; the other builds multiply the rounded values in float32: the same products,
summed in another order). With int8 scoring (`score_dtype=torch.int8`) every query head row and
key row is quantized to symmetric int8 (`reference.quantize_int8`; an int8 key cache brings its
per-row scales) and the dot products are exact integer sums (`vpdpbusd` on the avx512bf16 build,
whose CPUs all have AVX512-VNNI, on avx512vnni, the AVX-512 build for VNNI CPUs without BF16, and
on avx2vnni (AVX-VNNI, 8 lanes); `vpmaddwd` on int16 pairs on avx512 / avx2; plain C++ on portable). `SGL_KERNEL_NPU_BF16_DOT=dpbf16` (or `bf16_dot("dpbf16")`) makes the
avx512bf16 build use vdpbf16ps for that: the same products, but on Sapphire / Emerald Rapids it
retires half the multiply-adds per cycle of the two FMA ports (benchmark/dsa/indexer_kernel.py),
so the default is `fma`. FP8 rows are read in 1 byte and widened in the kernels (exact, through
float16 bits; csrc/cpu/dsa_fp8.h): float8_e4m3fn index keys with their per-block scales (each value
times its block's scale in float32, then scored at any precision above), and float8_e4m3fn /
float8_e5m2 latent rows of the sparse attention with one `kv_scale`.
"""

from __future__ import annotations

import contextlib
import functools
import os
from types import ModuleType
from typing import Iterator, Optional, Sequence

import torch

from sgl_kernel_npu.layouts import FP8_KEY_BLOCK, PagedKeys, Queries

try:  # the extension built by setup.py
    from sgl_kernel_npu import _cpu_ops as _ops
except ImportError as e:  # pragma: no cover - a build without the CPU kernels
    _ops = None
    _IMPORT_ERROR: Optional[ImportError] = e
else:
    _IMPORT_ERROR = None

ISAS = ("avx512bf16", "avx512vnni", "avx512", "avx2vnni", "avx2", "portable")  # isa.py's, best first
BF16_DOTS = ("fma", "dpbf16")
_forced: Optional[str] = None
_forced_dot: Optional[str] = None


def available() -> bool:
    return _ops is not None


def _require() -> None:
    if _ops is None:
        raise RuntimeError(f"sgl_kernel_npu was installed without its CPU kernels ({_IMPORT_ERROR})")


@functools.lru_cache(maxsize=1)
def selector() -> Optional[ModuleType]:
    """SGLang's ISA selector (sglang/srt/kernels/cpu/isa.py, standard library only), or None where
    this package runs without SGLang."""
    try:
        from sglang.srt.kernels.cpu import isa
    except ImportError:
        return None
    return isa


@functools.lru_cache(maxsize=None)
def _selected(request: str) -> str:
    return selector().select(request)  # CPU flags read once per request (IsaNotRunnable is not kept)


def requested_isa() -> str:
    """The ISA the kernels run: force_isa's, else SGLANG_CPU_ISA's (both through SGLang's selector:
    `auto` -> the best this CPU runs, one it cannot run refused); "auto" (the extension's own pick)
    without SGLang."""
    request = _forced or os.environ.get("SGLANG_CPU_ISA", "auto") or "auto"
    return _selected(request.strip().lower()) if selector() is not None else request


def active_isa() -> str:
    """The instruction set the kernels run with now."""
    _require()
    return _ops.pick_isa(requested_isa())


def supported_isas() -> list[str]:
    """The instruction sets this CPU can run, best first (the selector's answer where SGLang is
    installed; every one the extension has compiled in, and its check of the CPU agrees)."""
    _require()
    sel = selector()
    runnable = sel.runnable_isas() if sel is not None else ISAS
    return [isa for isa in _ops.isas() if isa in runnable and _ops.cpu_supports(isa)]


@contextlib.contextmanager
def force_isa(isa: str) -> Iterator[None]:
    global _forced
    old, _forced = _forced, isa
    try:
        yield
    finally:
        _forced = old


def requested_bf16_dot() -> str:
    dot = _forced_dot or os.environ.get("SGL_KERNEL_NPU_BF16_DOT", "fma") or "fma"
    if dot not in BF16_DOTS:
        raise ValueError(f"SGL_KERNEL_NPU_BF16_DOT must be one of {BF16_DOTS}, got {dot!r}")
    return dot


@contextlib.contextmanager
def bf16_dot(dot: str) -> Iterator[None]:
    """How the avx512bf16 build multiplies bf16 index scores in this block: "fma" or "dpbf16"."""
    global _forced_dot
    if dot not in BF16_DOTS:
        raise ValueError(f"bf16 dot must be one of {BF16_DOTS}, got {dot!r}")
    old, _forced_dot = _forced_dot, dot
    try:
        yield
    finally:
        _forced_dot = old


def _int32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int32).contiguous()


def _rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    x = x.to(dtype)
    return x if x.stride(-1) == 1 else x.contiguous()


def indexer_topk(
    qs: Queries,
    weights: torch.Tensor,
    keys: PagedKeys,
    k: int,
    want_values: bool = False,
    score_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    _require()
    q = qs.q if qs.q.stride(-1) == 1 else qs.q.contiguous()
    if q.dtype not in (torch.float32, torch.bfloat16):
        q = q.float()
    kept = (torch.float32, torch.bfloat16, torch.int8, torch.float8_e4m3fn)
    kd = keys.rows.dtype if keys.rows.dtype in kept else torch.float32
    bf16 = score_dtype == torch.bfloat16 or (q.dtype == torch.bfloat16 and kd == torch.bfloat16)
    score = 2 if score_dtype == torch.int8 else 1 if bf16 else 0
    scale = None if keys.scale is None else keys.scale.float()
    if scale is not None and scale.stride(-1) != 1:  # (rows may be strided: a pool's interleaved scales)
        scale = scale.contiguous()
    idx, val = _ops.indexer_topk(
        q,
        weights.float().contiguous(),
        _rows(keys.rows, kd),
        scale,
        _int32(keys.block_table),
        keys.block_size,
        _int32(qs.batch),
        _int32(qs.kv_end),
        k,
        want_values,
        score,
        requested_bf16_dot() == "dpbf16",
        FP8_KEY_BLOCK,
        requested_isa(),
    )
    return idx, (val if want_values else None)


def sparse_attention(
    q: torch.Tensor,
    q_rope: Optional[torch.Tensor],
    key: PagedKeys,
    key_rope: Optional[torch.Tensor],
    value: torch.Tensor,
    batch: torch.Tensor,
    limit: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    kv_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    _require()
    dt = q.dtype if q.dtype in (torch.float32, torch.bfloat16) else torch.float32
    qq = _rows(q, dt)
    qr = _rows(q_rope, dt) if q_rope is not None else None
    fp8 = key.rows.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    rt = key.rows.dtype if fp8 else dt  # FP8 rows are read as stored (widened in the kernel)
    out, lse = _ops.sparse_attention(
        qq,
        qr,
        _rows(key.rows, rt),
        _rows(key_rope, rt) if key_rope is not None else None,
        _rows(value, rt),
        _int32(key.block_table),
        key.block_size,
        _int32(batch),
        _int32(limit),
        _int32(indices),
        float(scale),
        float(kv_scale) if fp8 else 1.0,
        requested_isa(),
    )
    return out.to(q.dtype), lse


def merge_attn_states(
    outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    _require()
    shape, dim = lses[0].shape, outs[0].shape[-1]
    o2 = [o.float().reshape(-1, dim).contiguous() for o in outs]
    l2 = [x.float().reshape(-1).contiguous() for x in lses]
    out, lse = _ops.merge_states(o2, l2, requested_isa())
    return out.view(*shape, dim).to(outs[0].dtype), lse.view(shape)
