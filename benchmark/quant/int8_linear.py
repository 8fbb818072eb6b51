"""W8A8-INT8 linear vs bf16 vs float32 on CPU, at decode and prefill sizes, ratios in one run.

Per shape (out x in; defaults: SmolLM2-1.7B's o_proj 2048 x 2048 and its gate_up 16384 x 2048)
and rows (1 and 8: decode batches; 512: a prefill chunk), timed interleaved round by round, median:
  float32   what the model runs with --dtype float32 (F.linear, or the platform's packed kernel
            when it has one for float32)
  bf16      --dtype bfloat16: the platform's packed bf16 GEMM (oneDNN) where it has one
  w8a8      `W8A8Int8LinearMethod` after loading (its weight packed at prepack time): the fused CPU
            kernel `int8_linear` (kernels/cpu/csrc/int8_linear.cpp: per-token quantization, int32
            GEMM, both scales, bf16 output in one call) where the kernel build has it
  w8a8-torch  the same layer unpacked: the torch ops of `w8a8_int8_linear` (per-token quantization,
            torch._int_mm (oneDNN; VNNI / AMX-INT8 where present), scales, bf16 output)
and the weight bytes each reads. One thread per --threads.

    python benchmark/quant/int8_linear.py --threads 2
    python benchmark/quant/int8_linear.py --threads 1 --thread-cpu   # on a busy machine
"""

from __future__ import annotations

import argparse
import statistics
import time
import torch
from torch import nn
from torch.utils import benchmark

from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.linear_prepack import prepack_linear_weights
from sglang.srt.layers.quantization.w8a8_int8 import W8A8Int8LinearMethod, channel_quantize_int8
from sglang.srt.platforms import get_platform


def _ms(fn, reps: int, cpu: bool = False) -> float:
    """Mean ms per call over `reps` calls (after one warm-up call); `cpu`: the calling thread's CPU
    time instead of wall time (with --threads 1 all the work runs on it, so other processes on the
    machine slow it much less than they slow wall time)."""
    if not cpu:
        timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
        return timer.timeit(reps).mean * 1e3
    fn()
    t0 = time.thread_time()
    for _ in range(reps):
        fn()
    return (time.thread_time() - t0) / reps * 1e3


def _layers(n: int, k: int) -> dict[str, tuple[nn.Module, torch.dtype, int]]:
    w = torch.randn(n, k) * 0.05
    out = {}
    for name, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)):
        lin = ReplicatedLinear(k, n, params_dtype=dtype)
        lin.weight.data.copy_(w)
        holder = nn.Sequential(lin)
        prepack_linear_weights(holder, get_platform("cpu"))
        out[name] = (lin, dtype, n * k * lin.weight.element_size())
    q, s = channel_quantize_int8(w)
    for name, packed in (("w8a8", True), ("w8a8-torch", False)):
        lin = ReplicatedLinear(k, n, params_dtype=torch.bfloat16)
        W8A8Int8LinearMethod().create_weights(lin, "bench")
        lin.weight.data.copy_(q)
        lin.weight_scale.data.copy_(s)
        if packed:
            prepack_linear_weights(nn.Sequential(lin), get_platform("cpu"))
        out[name] = (lin, torch.bfloat16, n * k)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["2048x2048", "16384x2048"], help="out x in")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 512], help="activation rows (tokens)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median taken)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument(
        "--thread-cpu",
        action="store_true",
        help="time by the calling thread's CPU time (use with --threads 1)",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    clock = "thread CPU" if args.thread_cpu else "wall"
    print(
        f"{args.threads} thread(s); {clock} ms per call, median of {args.rounds} rounds; ratio = w8a8 / best float"
    )
    print(
        f"{'shape':>12} {'rows':>5} {'float32':>9} {'bf16':>9} {'w8a8':>9} {'w8a8-torch':>10} {'ratio':>6}"
        "  weight MiB f32/bf16/int8"
    )
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        layers = _layers(n, k)
        for m in args.rows:
            x = torch.randn(m, k)
            times: dict[str, list[float]] = {name: [] for name in layers}
            with torch.inference_mode():
                for _ in range(args.rounds):
                    for name, (lin, dtype, _) in layers.items():
                        xd = x.to(dtype)
                        times[name].append(_ms(lambda: lin(xd), args.reps, args.thread_cpu))
            med = {name: statistics.median(t) for name, t in times.items()}
            ratio = med["w8a8"] / min(med["float32"], med["bf16"])
            mib = "/".join(f"{layers[nm][2] / 2**20:.0f}" for nm in ("float32", "bf16", "w8a8"))
            print(
                f"{shape:>12} {m:>5} {med['float32']:>9.3f} {med['bf16']:>9.3f} {med['w8a8']:>9.3f}"
                f" {med['w8a8-torch']:>10.3f} {ratio:>6.2f}  {mib}"
            )


if __name__ == "__main__":
    main()
