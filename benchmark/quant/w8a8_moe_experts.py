"""W8A8-INT8 routed experts: the torch expert loop (`w8a8_int8_linear` per expert, then the gate)
against the experts packed for the fused int8 kernel with the SwiGLU gate in w13's epilogue
(`W8A8Int8MoEMethod.pack_weights`), bf16 activations, interleaved rounds, median ms per call.

    .venv/bin/python benchmark/quant/w8a8_moe_experts.py --threads 2

Default shape: a Qwen3-30B-A3B-like layer cut to 16 experts (hidden 2048, expert intermediate 768,
top 8), random int8 weights.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tqdm import tqdm


def make_moe(experts: int, hidden: int, inter: int, pack: bool):
    from sglang.srt.layers.moe.experts import FusedMoE
    from sglang.srt.layers.quantization.w8a8_moe import W8A8Int8MoEMethod

    moe = FusedMoE(experts, hidden, inter, None, None, torch.bfloat16)
    W8A8Int8MoEMethod().create_weights(moe)
    g = torch.Generator().manual_seed(0)
    for w, s in ((moe.w13_weight, moe.w13_weight_scale), (moe.w2_weight, moe.w2_weight_scale)):
        w.data.copy_(torch.randint(-127, 128, w.shape, generator=g, dtype=torch.int8))
        s.data.fill_(1e-3)
    if pack and moe.quant_method.pack_weights(moe) is None:
        raise SystemExit("no fused int8 kernel in this build: nothing to compare")
    return moe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 512])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    plain = make_moe(args.experts, args.hidden, args.inter, pack=False)
    packed = make_moe(args.experts, args.hidden, args.inter, pack=True)
    print(
        f"{args.threads} thread(s), {args.experts} experts, hidden {args.hidden}, inter {args.inter}, top {args.topk}"
    )
    print(f"{'tokens':>6}  {'torch ms':>9}  {'packed ms':>9}  ratio")
    for tokens in tqdm(args.tokens, desc="token counts", leave=False):
        x = torch.randn(tokens, args.hidden).bfloat16()
        ids = torch.stack([torch.randperm(args.experts)[: args.topk] for _ in range(tokens)])
        weights = torch.rand(tokens, args.topk)
        times: dict[str, list[float]] = {"torch": [], "packed": []}
        for _ in range(args.rounds):
            for name, moe in (("torch", plain), ("packed", packed)):
                start = time.perf_counter()
                moe(x, weights, ids)
                times[name].append(time.perf_counter() - start)
        a, b = statistics.median(times["torch"]), statistics.median(times["packed"])
        print(f"{tokens:6d}  {1000 * a:9.2f}  {1000 * b:9.2f}  {b / a:.2f}")


if __name__ == "__main__":
    main()
