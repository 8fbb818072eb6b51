"""CPU platform: gloo, no streams, memory from /proc/meminfo."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from typing import Any, ContextManager, Optional

import torch

from sglang.srt.platforms import cpu_linears, launch_defaults
from sglang.srt.platforms.base import NullEvent, NullStream, Platform, null_stream_context
from sglang.srt.platforms.cpu_kinds import (  # noqa: F401 (re-exported: cpu.<name> is how callers reach them)
    BF16_GEMM_MAX_TOKENS,
    CPU_KINDS,
    FAST_BF16_DOT_VENDORS,
    FMA_BF16_IMPLS,
    FLOAT32_GEMM_MIN_TOKENS,
    KIND_ALIASES,
    KIND_FLAGS,
    CpuDtypeChoice,
    choose_dtype,
    cpu_kind,
    effective_cpu_flags,
    effective_cpu_vendor,
    fast_bf16_dot,
)
from sglang.srt.platforms.host_memory import PagePopulator, lazy_zeros

logger = logging.getLogger(__name__)


def read_meminfo(path: str = "/proc/meminfo") -> tuple[int, int]:
    """(available_bytes, total_bytes) from a Linux meminfo file; falls back to sysconf."""
    fields: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    fields[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    if "MemTotal" in fields:
        free = fields.get("MemAvailable", fields.get("MemFree", 0))
        return free, fields["MemTotal"]
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    dsa_ops_impl = "cpu"  # fused C++ DSA kernels of sgl_kernel_npu (the ISA kernels/cpu/isa.py selects)
    # torch's CPU flash attention works in key blocks of 512 (query blocks of 256 from 768
    # queries on): chunks that are whole multiples of its tiles run faster per token than chunks
    # between them at the same prefix (docs/benchmarks.md, dynamic chunking).
    prefill_chunk_alignment = 512
    # Below 768 queries it switches to query blocks of 64, which loses more than a smaller pipeline
    # bubble gains (docs/benchmarks.md), so auto's chunks start there.
    prefill_min_chunk = 768
    # fused decode / AMX prefill kernels and zero-copy pool views (layers/attention/cpu_backend.py)
    default_attention_backend = launch_defaults.ATTENTION_BACKEND_DEFAULTS["cpu"]
    memory_shared_by_local_ranks = True  # every rank of the host draws on its RAM
    # float32 logits from bf16 weights cost the bytes of a bf16 GEMM here (kernels/cpu linear_f32out;
    # layers/linear_float32_out.py); bf16 logits turned the default model's demo answer on a near tie
    float32_logits_by_default = True
    # and bf16 sums of the residual over 30 layers flipped that same tie on the amx kind (all-bf16
    # prefill); float32 residuals cost 2 extra bytes per hidden value per layer, added by the fused norm
    float32_residual_by_default = True
    # CP on CPU splits prompts of 512 tokens and more: below that the split's per-layer exchange
    # costs more than it saves (256 tokens: split 1.34x cp 1's TTFT, whole on every rank 0.96x),
    # from 512 the split is within 1.06x of cp 1 and 0.66x at 4K (the 2-vCPU AMX VM, 2026-11-28,
    # benchmark/context_parallel/bench_cp_adaptive.py; docs/benchmarks.md). Ranks that share a
    # socket's cores and bandwidth made running whole slower than cp 1 on loaded boxes, so the bar
    # stays low.
    cp_min_split_tokens = 512

    @classmethod
    def is_available(cls) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def configure_process(self) -> None:
        """Keep freed activation memory in the process (glibc malloc).

        By default glibc serves blocks above a (dynamic) threshold with fresh mmaps and returns
        freed heap tops to the OS, so every forward's multi-MB activations are new pages that
        fault in again (the gain: docs/benchmarks.md). Costs: the resident size stays at its peak.
        SGLANG_CPU_MALLOC_TUNE=0 turns it off; no-op where libc is not glibc.
        """
        from sglang.srt import envs

        if not envs.SGLANG_CPU_MALLOC_TUNE.get():
            return
        try:
            libc = ctypes.CDLL("libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            return
        m_trim_threshold, m_mmap_threshold, m_mmap_max = -1, -3, -4  # <malloc.h>
        mallopt(m_mmap_threshold, 32 * 2**20)  # glibc's largest allowed mmap threshold (64-bit)
        mallopt(m_trim_threshold, 2**31 - 1)
        # Blocks above that threshold (an 8192-token chunk's [8192, 2 x intermediate] MLP
        # activations, 50 MB for SmolLM2) would still be fresh mmaps, faulted in again every layer:
        # serve every size from the heap instead (an 8000-token prefill 3.13 -> 2.87 s; 4K prefills
        # and decode unchanged). glibc still falls back to mmap if the heap cannot grow.
        mallopt(m_mmap_max, 0)

    def __init__(self) -> None:
        super().__init__()
        # `--dtype auto`'s choice on this platform object (the process's: get_platform keeps one),
        # set by resolve_auto_dtype and read when the linears are packed after loading; None: no
        # auto choice, every linear runs in the model dtype. `_mixed`: the choice's mixed linears
        # (their shared weight-copy budget), made when the first linear is packed.
        self.dtype_choice: Optional[CpuDtypeChoice] = None
        self._mixed: Optional[Any] = None

    def auto_dtype_choice(self) -> CpuDtypeChoice:
        """What `--dtype auto` is here: choose_dtype with this platform's kernel build."""
        return choose_dtype(fma_bf16=self.kernels.bf16_fma() is not None)

    def resolve_auto_dtype(self, hf_config: Any = None) -> torch.dtype:
        """`--dtype auto` on CPU: chosen from the CPU's native instructions (choose_dtype), logged,
        and kept on this platform for the linears packed after loading."""
        choice = self.auto_dtype_choice()
        logger.info("--dtype auto on this CPU (%s): %s; reason: %s", choice.kind, choice.mode, choice.reason)
        self.dtype_choice, self._mixed = choice, None
        return choice.dtype

    def use_explicit_dtype(self, dtype: torch.dtype) -> None:
        self.dtype_choice, self._mixed = None, None

    def prepacked_linear(self, dtype: torch.dtype, device: torch.device):
        """bf16: the kernels' `bf16_linear` on AMX, on AMD's AVX512-BF16 and on AVX-512 without BF16
        (its FMA path), else oneDNN's packed linear where this torch build and CPU support it
        (platforms/cpu_linears.py); under `--dtype auto` the mixed linears of layers/linear_mixed.py
        (float32 with bf16 copies without native bf16; bf16 with float32 copies on AVX-512 without
        AMX and on AVX2 with the FMA path)."""
        choice = self.dtype_choice
        if choice is None or device.type != "cpu":
            return self._bf16_linear(dtype, device)
        if choice.bf16_gemm_max_tokens is not None and dtype == torch.float32:
            return self._mixed_linears().bf16_copies(choice.bf16_gemm_max_tokens)
        packed = self._bf16_linear(dtype, device)
        if choice.float32_gemm_min_tokens is not None and dtype == torch.bfloat16:
            return self._mixed_linears().float32_prefill(choice.float32_gemm_min_tokens, packed)
        return packed

    def _mixed_linears(self):
        if self._mixed is None:
            from sglang.srt.layers.linear_mixed import MixedLinears

            # the weight copies may take a quarter of the RAM free when the first linear is packed
            self._mixed = MixedLinears(copy_budget_bytes=read_meminfo()[0] // 4)
        return self._mixed

    def _bf16_linear(self, dtype: torch.dtype, device: torch.device):
        vec = self.kernels.bf16_vec() or self.kernels.bf16_fma()
        return cpu_linears.bf16_linear(self.kernels.amx_linears(), dtype, device, vec=vec)

    def bf16_vec_kernels(self) -> Optional[Any]:
        """The fused kernel module where bf16 work runs on `vdpbf16ps` (AVX512-BF16 without AMX, of a
        FAST_BF16_DOT_VENDORS vendor): its bf16 linears beat oneDNN's (cpu_linears.py) and decode
        attention scores by bf16 dot products; else None."""
        kind = cpu_kind(effective_cpu_flags())
        if kind != "avx512-bf16" or not fast_bf16_dot(kind, effective_cpu_vendor()):
            return None
        return self._build_answering("avx512-bf16")

    def bf16_fma_kernels(self) -> Optional[Any]:
        """The avx512 build on AVX-512 CPUs without BF16 (Cascade Lake / Skylake-SP: the `avx512`
        kind), the avx2 build on AVX2 CPUs: their `bf16_linear` widens each packed bf16 weight pair
        by a shift and a mask and runs float32 FMAs, reading the bf16 weights once per call for all
        rows, where oneDNN's bf16 linear converts in slow fallback paths (cpu_linears.py); else
        None. With it, both kinds' `--dtype auto` is bf16 with float32 copies for prefill-sized
        linears (`choose_dtype`)."""
        impl = FMA_BF16_IMPLS.get(cpu_kind(effective_cpu_flags()))
        return None if impl is None else self._build_answering(impl)

    def amx_linear_kernels(self) -> Optional[Any]:
        # AMX as the kind says (an emulated kind without it keeps oneDNN's copy) and as the build says
        return self._build_answering("amx") if cpu_kind(effective_cpu_flags()) == "amx" else None

    def _build_answering(self, impl: str) -> Optional[Any]:
        """The fused kernel module if its `bf16_linear_impl()` is `impl`, else None."""
        ops = self.kernels.fused()
        return ops if ops is not None and getattr(ops, "bf16_linear_impl", str)() == impl else None

    def prefill_attention_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """bf16 prefill attention runs torch's float32 flash kernel on CPUs without AMX: its bf16
        kernel there goes through oneDNN's bf16 GEMMs (AVX512-BF16 `vdpbf16ps` at half the
        float32 FMA rate on the Xeon measured, converting fallbacks on AVX2) and is 1.7x slower
        than converting q / k / v to float32 and back (a 4096-token causal prefill, 9 heads of
        64: 171 vs 103 ms per layer on 2 threads; benchmark/vs_vllm/sdpa_dtype.py, docs/notes/2026-11-vs-vllm.md). Float32 is also exact
        where bf16 rounds the softmax probabilities. Where bf16 dot products beat float32 FMAs (AMX;
        AMD's AVX512-BF16: `fast_bf16_dot`) bf16 attention stays bf16: the AMX kernel, or the vector
        kernel's `bf16_dot` path (q.k and p.v by `vdpbf16ps`: 1.72x a 2K layer on a Zen 5)."""
        if dtype == torch.bfloat16 and not fast_bf16_dot(
            cpu_kind(effective_cpu_flags()), effective_cpu_vendor()
        ):
            return torch.float32
        return dtype

    def default_chunked_prefill_size(self) -> int:
        """2048 on CPU (as upstream picks for small GPUs): a CPU's prefill runs near its FMA peak
        from a few hundred rows on, so smaller steps cost little prefill speed, while prompts that
        arrive together get their first tokens step by step instead of all at the end of one long
        step. Measured (docs/notes/2026-11-vs-vllm.md, vs vLLM on the AVX512-BF16 Xeon, 2 cores): 8192 -> 2048
        took TTFT median (a) 3444 -> 2046 ms, (d) 4566 -> 3724 ms, (b) 5026 -> 5145 ms; output
        throughput (a) 146 -> 147 tok/s, (d) 91.7 -> 76.2 tok/s (staggered requests decode in
        smaller batches)."""
        return launch_defaults.default_chunked_prefill_size("cpu")

    def fused_kernels(self) -> Optional[Any]:
        """kernels/cpu: the install-time build for this CPU's instruction set (None where it was
        not built, or with SGLANG_CPU_KERNELS=0)."""
        from sglang.srt import envs

        if not envs.SGLANG_CPU_KERNELS.get():
            return None
        from sglang.srt.kernels.cpu import loader

        return loader.load()

    def release_freed_memory(self) -> None:
        """malloc_trim(0): the trim threshold `configure_process` sets keeps freed heap memory resident,
        so what loading freed (float weights replaced by int8 at `--quantization w8a8_int8`, the
        plain int8 weights replaced by their packed copies) would stay in the resident size: a ~1B
        model quantized online 3.9 -> 1.7 GB resident. No-op where libc is not glibc."""
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass

    def int8_linear_entry(self, ops: Any) -> Any:
        """The avx512 / avx2 builds carry a copy of the W8A8 linear compiled for AVX512-VNNI /
        AVX-VNNI (`int8_linear_vnni`): taken where the instruction set the kernels run has VNNI."""
        from sglang.srt.kernels.cpu import loader

        vnni = getattr(ops, "int8_linear_vnni", None)
        return vnni if vnni is not None and loader.isa_has_vnni() else ops.int8_linear

    def device(self, local_rank: int = 0) -> torch.device:
        return torch.device("cpu")

    def set_device(self, local_rank: int = 0) -> None:
        pass

    def current_device(self) -> torch.device:
        return torch.device("cpu")

    def synchronize(self) -> None:
        pass

    def memory_info(self) -> tuple[int, int]:
        return read_meminfo()

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
        """Pools from anonymous maps (host_memory.py): zero pages committed on first write, so a start
        does not write the whole pool and a pool costs RAM as it fills."""
        return lazy_zeros(shape, dtype)

    def host_zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """As `zeros`: a host tier costs RAM as it fills, not at start."""
        return lazy_zeros(shape, dtype)

    def page_populator(self) -> Optional[Any]:
        # MADV_POPULATE_WRITE is Linux's (the number means something else elsewhere)
        return PagePopulator().populate if sys.platform.startswith("linux") else None

    def current_stream(self) -> Any:
        return NullStream()

    def new_stream(self) -> Any:
        return NullStream()

    def stream(self, stream: Any) -> ContextManager:
        return null_stream_context(stream)

    def new_event(self, enable_timing: bool = False) -> Any:
        return NullEvent()
