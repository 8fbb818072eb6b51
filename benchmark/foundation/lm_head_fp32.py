"""Cost of float32 logits (--enable-fp32-lm-head, the CPU default) at the LM head, in one run.

Per batch size (rows needing logits: decode requests), the LM head of the default model's shape
(vocab 49152 x hidden 576, or --vocab/--hidden) is timed, interleaved round by round:
  bf16-onednn   the packed bf16 GEMM the head used before (bf16 logits)
  f32out-<isa>  the linear_f32out_packed kernel of each CPU build this machine runs (float32
                logits from the packed bf16 weight: layers/linear_float32_out.py)
  f32-weight    F.linear on a float32 copy of the weight (twice the bytes)
and the bytes a step reads, so the ms compare with the memory bandwidth. One thread per --threads.

    python benchmark/foundation/lm_head_fp32.py --threads 2 --batch 1 8 32
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from sglang.srt.kernels.cpu import isa, loader
from sglang.srt.layers.linear_float32_out import pack_bf16_pairs


def _time(fn, reps: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    w = torch.randn(args.vocab, args.hidden).bfloat16()
    w32 = w.float()
    ops = torch.ops.mkldnn
    packed = ops._reorder_linear_weight(w, None)
    pairs = pack_bf16_pairs(w)
    builds = {v.name: loader.load_variant(v.name).module for v in isa.runnable_variants()}
    print(
        f"LM head {args.vocab} x {args.hidden}, {args.threads} thread(s); bf16 weight {w.numel() * 2 / 2**20:.0f} MiB"
    )
    for n in args.batch:
        x = torch.randn(n, args.hidden)
        xb = x.bfloat16()
        cases = {"bf16-onednn": lambda: ops._linear_pointwise(xb, packed, None, "none", [], "")}
        for name, mod in builds.items():
            if mod is not None:
                cases[f"f32out-{name}"] = lambda mod=mod: mod.linear_f32out_packed(x, pairs, args.vocab)
        cases["f32-weight"] = lambda: F.linear(x, w32)
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.rounds):  # interleaved: the box's drift hits every case alike
            for k, fn in cases.items():
                times[k].append(_time(fn, args.reps))
        base = statistics.median(times["bf16-onednn"])
        row = ", ".join(
            f"{k} {statistics.median(v):.2f} ms ({statistics.median(v) / base:.2f}x)"
            for k, v in times.items()
        )
        print(f"batch {n}: {row}")


if __name__ == "__main__":
    main()
