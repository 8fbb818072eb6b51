"""CPU platform: gloo, no streams, memory from /proc/meminfo."""

from __future__ import annotations

import ctypes
import os
from typing import Any, ContextManager, Optional

import torch

from sglang.srt.platforms.base import NullEvent, NullStream, Platform, null_stream_context


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
    dsa_ops_impl = "cpu"  # fused C++ DSA kernels of sgl_kernel_npu (AVX-512 / AVX2 / portable by CPU flags)
    # torch's CPU flash attention works in key blocks of 512 (query blocks of 256 from 768
    # queries on): chunks that are whole multiples of its tiles run faster per token than chunks
    # between them at the same prefix (docs/benchmarks.md, dynamic chunking).
    prefill_chunk_alignment = 512
    # Below 768 queries it switches to query blocks of 64, which loses more than a smaller pipeline
    # bubble gains (docs/benchmarks.md), so auto's chunks start there.
    prefill_min_chunk = 768
    # fused decode / AMX prefill kernels and zero-copy pool views (layers/attention/cpu_backend.py)
    default_attention_backend = "cpu"
    memory_shared_by_local_ranks = True  # every rank of the host draws on its RAM

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

    def prepacked_linear(self, dtype: torch.dtype, device: torch.device):
        """oneDNN's packed bf16 linear, where this torch build and CPU support it."""
        ops = getattr(torch.ops, "mkldnn", None)
        if dtype != torch.bfloat16 or device.type != "cpu" or ops is None:
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

    def fused_kernels(self) -> Optional[Any]:
        """kernels/cpu: the install-time build for this CPU's instruction set (None where it was
        not built, or with SGLANG_CPU_KERNELS=0)."""
        from sglang.srt import envs

        if not envs.SGLANG_CPU_KERNELS.get():
            return None
        from sglang.srt.kernels.cpu import loader

        return loader.load()

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

    def current_stream(self) -> Any:
        return NullStream()

    def new_stream(self) -> Any:
        return NullStream()

    def stream(self, stream: Any) -> ContextManager:
        return null_stream_context(stream)

    def new_event(self, enable_timing: bool = False) -> Any:
        return NullEvent()
