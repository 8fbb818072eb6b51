"""GEMM time per dtype for SmolLM2-135M's linear shapes, to choose `--dtype auto` on a CPU kind.

  ONEDNN_MAX_CPU_ISA=AVX2 SGLANG_CPU_ISA=avx2 .venv/bin/python benchmark/vs_vllm/dtype_gemm.py

Per token count M (decode batch sizes and prefill chunks), the time of one layer's linears
(qkv, o, gate_up, down) in: bf16 (F.linear), bf16 prepacked (oneDNN, where torch offers it),
float32, "mixed" (bf16 activations upcast, float32 GEMM on a float32 copy of the weight, result back
to bf16: layers/linear_mixed.py) and "upcast" (the same with the weight upcast per call).
Add ATEN_CPU_CAPABILITY=avx2 to emulate an AVX2 CPU in torch's own kernels too.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

# (in, out) of one SmolLM2-135M layer: fused qkv, o, fused gate_up, down
SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]


def bench(fn, min_s: float = 0.3) -> float:
    """Fastest of repeated calls (the box is shared: the minimum is the least disturbed)."""
    fn()
    best, n, t_end = float("inf"), 0, time.perf_counter() + min_s
    while n < 5 or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        n += 1
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,2,4,8,16,64,256,1024")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    w32 = [torch.randn(o, i) * 0.05 for i, o in SHAPES]
    w16 = [w.bfloat16() for w in w32]
    ops = getattr(torch.ops, "mkldnn", None)
    packed = None
    if ops is not None and hasattr(ops, "_linear_pointwise") and ops._is_mkldnn_bf16_supported():
        packed = [ops._reorder_linear_weight(w.contiguous(), None) for w in w16]
    env = " ".join(f"{k}={os.environ.get(k, '-')}" for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"))
    print(f"torch {torch.__version__}, threads {args.threads}, {env}, load {os.getloadavg()[0]:.2f}")
    print(
        f"{'M':>6} {'bf16 ms':>9} {'packed ms':>10} {'fp32 ms':>9} {'mixed ms':>9} {'upcast ms':>10}  (one layer's 4 linears)"
    )
    for m in [int(t) for t in args.tokens.split(",")]:
        xs32 = [torch.randn(m, i) for i, _ in SHAPES]
        xs16 = [x.bfloat16() for x in xs32]
        t_bf16 = bench(lambda: [F.linear(x, w) for x, w in zip(xs16, w16)])
        t_pack = (
            bench(lambda: [ops._linear_pointwise(x, p, None, "none", [], "") for x, p in zip(xs16, packed)])
            if packed
            else float("nan")
        )
        t_fp32 = bench(lambda: [F.linear(x, w) for x, w in zip(xs32, w32)])
        t_mix = bench(lambda: [F.linear(x.float(), w).bfloat16() for x, w in zip(xs16, w32)])
        t_up = bench(lambda: [F.linear(x.float(), w.float()).bfloat16() for x, w in zip(xs16, w16)])
        print(
            f"{m:>6} {t_bf16 * 1e3:9.3f} {t_pack * 1e3:10.3f} {t_fp32 * 1e3:9.3f} {t_mix * 1e3:9.3f} {t_up * 1e3:10.3f}"
        )


if __name__ == "__main__":
    main()
