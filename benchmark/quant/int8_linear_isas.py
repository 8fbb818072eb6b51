"""The fused W8A8 linear of every kernel build this CPU runs, and of its VNNI copy where the build
carries one (avx512 / avx2: `int8_linear_vnni`, what the avx512vnni / avx2vnni ISAs run), wall ms
per call (best of --rounds rounds of --reps calls), ratios to the build's own path in one run.

    python benchmark/quant/int8_linear_isas.py --threads 2
"""

from __future__ import annotations

import argparse
import time

import torch

from sglang.srt.kernels.cpu import isa, loader
from sglang.srt.layers.quantization.w8a8_int8 import channel_quantize_int8, pack_int8_vnni


def best_ms(fn, rounds: int, reps: int) -> float:
    for _ in range(2):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps * 1e3)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["3072x576", "576x1536"], help="out x in")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 512])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.threads} thread(s); ms per call: the build's int8_linear / its VNNI copy (ratio)")
    for variant in isa.runnable_variants():
        module = loader.load_variant(variant.name).module
        if module is None:
            print(f"{variant.name}: not built")
            continue
        paths = [("int8_linear", module.int8_linear_impl(), module.int8_linear)]
        if hasattr(module, "int8_linear_vnni"):
            paths.append(("int8_linear_vnni", module.int8_linear_vnni_impl(), module.int8_linear_vnni))
        print(f"{variant.name}: " + ", ".join(f"{name} = {impl}" for name, impl, _ in paths))
        for shape in args.shapes:
            n, k = (int(v) for v in shape.split("x"))
            w, ws = channel_quantize_int8(torch.randn(n, k) * 0.1)
            packed, comp, scale = pack_int8_vnni(w, ws)
            cells = []
            for m in args.rows:
                x = torch.randn(m, k).bfloat16()
                ms = [
                    best_ms(lambda f=f: f(x, packed, comp, scale, n), args.rounds, args.reps)
                    for *_, f in paths
                ]
                ratio = f" ({ms[1] / ms[0]:.2f}x)" if len(ms) > 1 else ""
                cells.append(f"rows {m}: " + " / ".join(f"{v:.3f}" for v in ms) + ratio)
            print(f"  {shape:>10}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
