"""The packed bf16 linears `CpuPlatform.prepacked_linear` hands to layers/linear_prepack.py: the
kernels' `bf16_linear` on AMX, on AMD's AVX512-BF16 and on AVX-512 without BF16
(layers/linear_bf16_packed.py), oneDNN's packed linear elsewhere."""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch

# AMX: bf16 linears over at most this many rows run the kernels' bf16_linear (weights read once at
# the read bandwidth: 0.61-0.65x oneDNN's packed linear at 1-32 rows on SmolLM2's shapes), larger
# ones plain F.linear. A ~1B Llama's K = 2048 / 8192: 0.72-0.89x oneDNN at 32-128 rows, 1.24-1.50x
# from 192 on, where plain F.linear is 1.16-1.23x and from 320 on 0.96x.
BF16_LINEAR_MAX_ROWS = 128
# ... and up to this many rows for weights of at most BF16_LINEAR_NARROW_K inputs (SmolLM2's 576 /
# 1536: 0.68-0.87x oneDNN's packed linear and 0.72-0.79x plain F.linear at 384-1024 rows, where
# oneDNN splits some of these shapes over one thread only; 1.02-1.15x plain from 1536 rows on).
# benchmark/vs_vllm/bf16_linear_ab.py, docs/benchmarks.md ("Fused CPU kernels"), 2026-11-29.
BF16_LINEAR_NARROW_K = 1536
BF16_LINEAR_NARROW_MAX_ROWS = 1024
# AVX512-BF16 without AMX where bf16 dot products are fast (AMD: `fast_bf16_dot`): the build's
# vdpbf16ps path at every row count. SmolLM2's shapes over 30 layers, 2 threads, against oneDNN's
# packed linear: 0.56-0.70x at 1-8 rows, 0.84-0.93x at 16-64, 1.00-1.05x at 128-2048, where plain
# F.linear is 1.12-1.27x (1.02x at 512). The SwiGLU gate in its epilogue, as on AMX.
# benchmark/vs_vllm/bf16_linear_ab.py --vec-max-rows 4096, docs/benchmarks.md, [zen4] 2026-11-29.
BF16_VEC_LINEAR_MAX_ROWS = sys.maxsize
# AVX-512 without BF16 (the `avx512` kind, Cascade Lake / Skylake-SP): the avx512 build's FMA path
# (each bf16 weight pair widened by a shift and a mask) at every row count under an explicit bf16
# dtype; under `--dtype auto` calls from this many rows on take the float32 weight copies instead.
# Emulated on [zen4] (SGLANG_CPU_FLAGS_OVERRIDE=avx512, ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI),
# SmolLM2's shapes, 2 threads: 0.26-0.38x oneDNN's (converting) packed bf16 linear at 1-64 rows and
# 0.36-0.83x the float32 F.linear at 32-128 rows, 0.93-0.97x it at 256-1024 rows (in cache). The
# float32 copies keep prefill chunks as they were: no real CPU of the kind measured yet.
# benchmark/vs_vllm/bf16_linear_ab.py --build avx512, docs/benchmarks.md, 2026-11-30.
BF16_FMA_FLOAT32_MIN_ROWS = 256
# AVX2 with the avx2 build's FMA path (`--dtype auto`: bf16 model): calls from this many rows on take
# the float32 weight copies. Emulated on [zen4] (SGLANG_CPU_FLAGS_OVERRIDE=avx2, ONEDNN_MAX_CPU_ISA=AVX2,
# ATEN_CPU_CAPABILITY=avx2), SmolLM2's shapes over 30 layers, 2 threads, the kernel / the float32
# F.linear: 0.17-0.25x at 1-4 rows, 0.37x at 8, 0.50x at 16, 0.62x at 32, 0.92x at 64, 1.01x at 128.
BF16_FMA_AVX2_FLOAT32_MIN_ROWS = 128


def bf16_linear(
    amx: Optional[Any], dtype: torch.dtype, device: torch.device, vec: Optional[Any] = None
) -> Optional[tuple[Any, Any]]:
    """(pack, kernel) for bf16 weights on `device`, or None (plain F.linear). `amx`: the kernel
    build where its bf16 linears run AMX here (`Platform.amx_linear_kernels`); `vec`: the build
    where they run vdpbf16ps and beat oneDNN (AMD's AVX512-BF16, `CpuPlatform.bf16_vec_kernels`),
    or float32 FMAs on shift-widened weights (AVX-512 without BF16 and AVX2, `bf16_fma_kernels`).
    Elsewhere (Intel's AVX512-BF16 without AMX: unmeasured there) oneDNN's copy."""
    if dtype != torch.bfloat16 or device.type != "cpu":
        return None
    if amx is None and vec is not None:
        from sglang.srt.layers.linear_bf16_packed import Bf16PackedLinear

        def vec_entry(x, packed, n, bias=None, use_amx=True, swiglu=False) -> torch.Tensor:
            # vdpbf16ps or the FMA path (on an AMX CPU too: an emulated kind), whatever the caller
            # asks of use_amx
            return vec.bf16_linear(x, packed, n, bias, False, swiglu)

        return Bf16PackedLinear(vec_entry, max_rows=BF16_VEC_LINEAR_MAX_ROWS).pair()
    if amx is not None:
        from sglang.srt.layers.linear_bf16_packed import Bf16PackedLinear

        return Bf16PackedLinear(
            amx.bf16_linear,
            max_rows=BF16_LINEAR_MAX_ROWS,
            narrow_k=BF16_LINEAR_NARROW_K,
            narrow_max_rows=BF16_LINEAR_NARROW_MAX_ROWS,
        ).pair()
    return onednn_linear()


def onednn_linear() -> Optional[tuple[Any, Any]]:
    """oneDNN's packed bf16 linear, where this torch build and CPU support it."""
    ops = getattr(torch.ops, "mkldnn", None)
    if ops is None:
        return None
    try:
        if not (hasattr(ops, "_linear_pointwise") and ops._is_mkldnn_bf16_supported()):
            return None
    except (AttributeError, RuntimeError):
        return None

    def pack(weight: torch.Tensor) -> torch.Tensor:
        return ops._reorder_linear_weight(weight.contiguous(), None)

    def kernel(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        return ops._linear_pointwise(x, packed, bias, "none", [], "")

    return pack, kernel
