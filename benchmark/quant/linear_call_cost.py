"""Per-call cost of one packed linear at one row, weights in cache: the kernel called directly
against the layer called as the model calls it (`layer(x)`), W8A8-INT8 and bf16, so that what
the Python path adds to each of a decode step's ~120 linear calls shows apart from the weight reads.

    python benchmark/quant/linear_call_cost.py --shape 64x576 --calls 5000

Prints microseconds per call (best of `--rounds` rounds).
"""

from __future__ import annotations

import argparse
import time

import torch

from int8_vs_bf16_stream import build  # benchmark/quant/int8_vs_bf16_stream.py


def per_call_us(fn, calls: int, rounds: int) -> float:
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="64x576", help="out x in")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n, k = (int(v) for v in args.shape.split("x"))
    x = torch.randn(1, k).bfloat16()
    int8 = build([(n, k)], 1, True)[0]
    bf16 = build([(n, k)], 1, False)[0]
    w, comp, scale, kernel = int8.int8_packed
    packed, bf16_kernel = bf16.packed_weight
    rows = {
        "w8a8 kernel": lambda: kernel(x, w, comp, scale, n, None),
        "w8a8 layer(x)": lambda: int8(x),
        "bf16 kernel": lambda: bf16_kernel(x, packed, None),
        "bf16 layer(x)": lambda: bf16(x),
    }
    with torch.no_grad():
        for name, fn in rows.items():
            print(f"  {name}: {per_call_us(fn, args.calls, args.rounds):.2f} us a call")


if __name__ == "__main__":
    main()
