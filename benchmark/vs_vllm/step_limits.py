"""Measured machine rates for `step_breakdown.py`'s limits: memory read bandwidth (a large float32
sum) and GEMM rate (torch.mm on the model's per-layer shapes), with the thread count the server
uses. Run before the server starts (the CPU is shared)."""

from __future__ import annotations

import time

import torch

from step_trace import LlamaShape


def seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def best_of(fn, repeats: int) -> float:
    fn()  # warm-up: page faults, oneDNN primitive creation
    return min(seconds(fn) for _ in range(repeats))


def read_bandwidth(threads: int, mib: int = 1024, repeats: int = 5) -> dict:
    """Bytes/s of reading a float32 buffer far larger than the caches (its sum), and of a copy
    (read + write counted)."""
    torch.set_num_threads(threads)
    n = mib * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    t_sum = best_of(lambda: src.sum(), repeats)
    t_copy = best_of(lambda: dst.copy_(src), repeats)

    return {"read_bytes_per_s": n * 4 / t_sum, "copy_bytes_per_s": 2 * n * 4 / t_copy, "mib": mib}


def gemm_rates(shape: LlamaShape, tokens: int, threads: int, repeats: int = 3) -> dict:
    """FLOP/s of torch.mm over the four per-layer GEMM shapes at `tokens` rows, per dtype."""
    torch.set_num_threads(threads)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        flops = seconds = 0.0
        per_shape = {}
        for name, (k, n) in shape.gemm_shapes().items():
            a = torch.randn(tokens, k).to(dtype)
            b = torch.randn(k, n).to(dtype)
            t = best_of(lambda: torch.mm(a, b), repeats)
            per_shape[name] = 2.0 * tokens * k * n / t
            flops += 2.0 * tokens * k * n
            seconds += t
        out[str(dtype).replace("torch.", "")] = {"flops_per_s": flops / seconds, "per_shape": per_shape}
    return out
