"""Where a W8A8-INT8 linear's time goes on CPU, per part, at SmolLM2-135M's shapes.

Parts of `w8a8_int8_linear` timed on their own (ms per call, mean of --reps after a warm-up):
  quant     per_token_quant_int8(x): float, abs, amax, scale, divide, round, clamp, int8
  int_mm    torch._int_mm(x_q, weight.t()) (oneDNN), the weight as the layer holds it (a transposed view)
  int_mm_c  the same on a contiguous [K, N] copy of the weight (does the view cost a reorder per call?)
  epilogue  int32 -> float32, x per-token scale, x per-channel scale, -> bf16
  whole     w8a8_int8_linear end to end
  bf16      the bf16 layer as --dtype bfloat16 runs it (the platform's packed GEMM)

    python benchmark/quant/int8_linear_parts.py --threads 2
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils import benchmark

from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.linear_prepack import prepack_linear_weights
from sglang.srt.layers.quantization.w8a8_int8 import (
    channel_quantize_int8,
    per_token_quant_int8,
    w8a8_int8_linear,
)
from sglang.srt.platforms import get_platform

# SmolLM2-135M: fused qkv, o_proj, fused gate_up, down_proj (out x in)
SHAPES = ["960x576", "576x576", "3072x576", "576x1536"]


def _ms(fn, reps: int) -> float:
    fn()
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}).timeit(reps).mean * 1e3


def _bf16_layer(w: torch.Tensor) -> nn.Module:
    n, k = w.shape
    lin = ReplicatedLinear(k, n, params_dtype=torch.bfloat16)
    lin.weight.data.copy_(w)
    prepack_linear_weights(nn.Sequential(lin), get_platform("cpu"))
    return lin


def parts(n: int, k: int, m: int, reps: int) -> dict[str, float]:
    w = torch.randn(n, k) * 0.05
    wq, ws = channel_quantize_int8(w)
    wq_kn = wq.t().contiguous()
    x = torch.randn(m, k).to(torch.bfloat16)
    xq, xs = per_token_quant_int8(x)
    acc = torch._int_mm(xq, wq.t())
    bf16 = _bf16_layer(w)
    fns = {
        "quant": lambda: per_token_quant_int8(x),
        "int_mm": lambda: torch._int_mm(xq, wq.t()),
        "int_mm_c": lambda: torch._int_mm(xq, wq_kn),
        "epilogue": lambda: acc.float().mul_(xs).mul_(ws.reshape(1, -1)).to(torch.bfloat16),
        "whole": lambda: w8a8_int8_linear(x, wq, ws),
        "bf16": lambda: bf16(x),
    }
    with torch.inference_mode():
        return {name: _ms(fn, reps) for name, fn in fns.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=SHAPES, help="out x in")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, 1024], help="activation rows (tokens)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    names = ["quant", "int_mm", "int_mm_c", "epilogue", "whole", "bf16"]
    print(f"{args.threads} thread(s), ms per call")
    print(f"{'shape':>10} {'rows':>5} " + " ".join(f"{nm:>9}" for nm in names))
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        for m in args.rows:
            t = parts(n, k, m, args.reps)
            print(f"{shape:>10} {m:>5} " + " ".join(f"{t[nm]:>9.3f}" for nm in names))


if __name__ == "__main__":
    main()
