"""Weight-read rate of the packed W8A8-INT8 and bf16 linears at decode: a model's linears (default:
the dummy ~1B Llama's four per layer, 16 layers) called in order at one row, every layer's weights
its own (out of cache, as in a decode step), the two forms interleaved round by round in one
process so that both see the same memory speed.

    python benchmark/quant/int8_vs_bf16_stream.py --threads 2 --rounds 8

Prints each form's ms per pass and GB/s (weight bytes over the fastest pass). The served W8A8 /
bf16 decode ratio also carries the bf16 LM head and the per-step costs (served_dtypes.py).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from tqdm import tqdm

LLAMA_1B = ["3072x2048", "2048x2048", "16384x2048", "2048x8192"]  # qkv, o, gate_up, down (out x in)


def build(shapes: list[tuple[int, int]], layers: int, quant: bool) -> nn.ModuleList:
    from sglang.srt.layers.linear import ReplicatedLinear
    from sglang.srt.layers.linear_prepack import prepack_linear_weights
    from sglang.srt.layers.quantization.w8a8_int8 import W8A8Int8LinearMethod, channel_quantize_int8
    from sglang.srt.platforms import get_platform

    mods = nn.ModuleList()
    g = torch.Generator().manual_seed(0)
    for _ in tqdm(range(layers), desc=f"{'w8a8' if quant else 'bf16'} layers"):
        for n, k in shapes:
            layer = ReplicatedLinear(k, n, False, None, torch.bfloat16)
            w = torch.randn(n, k, generator=g) * 0.02
            if quant:
                W8A8Int8LinearMethod().create_weights(layer, "layer")
                wq, ws = channel_quantize_int8(w)
                layer.weight.data.copy_(wq)
                layer.weight_scale.data.copy_(ws)
            else:
                layer.weight.data.copy_(w.bfloat16())
            mods.append(layer)
    prepack_linear_weights(mods, get_platform("cpu"))
    return mods


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=LLAMA_1B, help="out x in, one layer's linears")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    forms = {"bf16": build(shapes, args.layers, False), "w8a8": build(shapes, args.layers, True)}
    xs = {k: torch.randn(1, k).bfloat16() for _, k in shapes}
    times: dict[str, list[float]] = {name: [] for name in forms}
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, mods in forms.items():
                t = time.perf_counter()
                for i, layer in enumerate(mods):
                    layer(xs[shapes[i % len(shapes)][1]])
                times[name].append(time.perf_counter() - t)
    weights = sum(n * k for n, k in shapes) * args.layers
    print(
        f"{args.layers} layers of {args.shapes}, 1 row, {args.threads} threads, {args.rounds} rounds interleaved"
    )
    for name, ts in times.items():
        nbytes = weights * (1 if name == "w8a8" else 2)
        best = min(ts)
        print(
            f"  {name}: fastest {best * 1e3:.2f} ms, median {sorted(ts)[len(ts) // 2] * 1e3:.2f} ms; "
            f"{nbytes / 1e9:.3f} GB at {nbytes / best / 1e9:.1f} GB/s"
        )


if __name__ == "__main__":
    main()
