"""The gate_up linear with the SwiGLU gate in its GEMM's epilogue against the linear then the
kernels' `silu_and_mul`, at SmolLM2's gate_up (3072 x 576) or --shape, interleaved round by round,
median ms per call, ratios in one run:
  bf16     `bf16_linear` (AMX, else vdpbf16ps) + silu_and_mul  vs  `bf16_linear(..., swiglu=True)`; and plain
           F.linear + silu_and_mul (what calls above the kernel's row limit run)
  w8a8     `int8_linear` + silu_and_mul        vs  `int8_linear(..., swiglu=True)`
The fused calls never write the [rows, 2d] activation.

    python benchmark/vs_vllm/swiglu_ab.py --threads 2 --rows 8 16 256 1024 2048 4096
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from sglang.srt.kernels.cpu import loader
from sglang.srt.layers.linear_bf16_packed import pack_bf16_kpairs
from sglang.srt.layers.quantization.w8a8_int8 import channel_quantize_int8, pack_int8_vnni
from sglang.srt.platforms import get_platform


def medians(fns: dict, rounds: int) -> dict:
    for fn in fns.values():
        fn()
    times: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="3072x576", help="out x in of the [gate; up] weight")
    p.add_argument("--rows", type=int, nargs="+", default=[8, 16, 256, 1024, 2048, 4096])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    get_platform("cpu").configure_process()  # the server's malloc settings
    ops = loader.choose().module
    if ops is None or ops.bf16_linear_impl() == "":
        raise SystemExit("needs a kernel build with bf16_linear (AVX512-BF16) here")
    amx = ops.bf16_linear_impl() == "amx"  # else the vdpbf16ps path
    n, k = (int(v) for v in args.shape.split("x"))
    w = torch.randn(n, k) * 0.05
    wb, packed8 = w.bfloat16(), pack_int8_vnni(*channel_quantize_int8(w))
    kp = pack_bf16_kpairs(wb)
    print(
        f"{args.threads} thread(s), gate_up {args.shape}, bf16_linear {ops.bf16_linear_impl()}, "
        f"median ms per call of {args.rounds} rounds"
    )
    print(
        f"{'rows':>6} {'bf16+gate':>10} {'fused':>8} {'ratio':>6} {'F+gate':>8} {'w8a8+gate':>10} {'fused':>8} {'ratio':>6}"
    )
    for rows in args.rows:
        x = torch.randn(rows, k).bfloat16()
        t = medians(
            {
                "bf": lambda: ops.silu_and_mul(ops.bf16_linear(x, kp, n, None, amx)),
                "bf_fused": lambda: ops.bf16_linear(x, kp, n, None, amx, True),
                "F": lambda: ops.silu_and_mul(F.linear(x, wb)),
                "i8": lambda: ops.silu_and_mul(ops.int8_linear(x, *packed8, n)),
                "i8_fused": lambda: ops.int8_linear(x, *packed8, n, swiglu=True),
            },
            args.rounds,
        )
        print(
            f"{rows:>6} {t['bf']:>10.3f} {t['bf_fused']:>8.3f} {t['bf_fused'] / t['bf']:>6.2f} {t['F']:>8.3f} "
            f"{t['i8']:>10.3f} {t['i8_fused']:>8.3f} {t['i8_fused'] / t['i8']:>6.2f}"
        )


if __name__ == "__main__":
    main()
