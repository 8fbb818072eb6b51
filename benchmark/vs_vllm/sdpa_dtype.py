"""torch's CPU causal flash attention on one prefill layer: bf16 vs float32 vs bf16 inputs run in
float32 (what `CpuPlatform.prefill_attention_dtype` picks on CPUs without AMX). SmolLM2 shape by
default (9 query heads, 3 KV heads, head dim 64).

    .venv/bin/python benchmark/vs_vllm/sdpa_dtype.py --threads 2 --tokens 4096
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=30, help="to scale a layer's time to the model")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    shapes = [(1, h, args.tokens, args.head_dim) for h in (args.heads, args.kv_heads, args.kv_heads)]
    bf16 = [torch.randn(s, generator=g).to(torch.bfloat16) for s in shapes]
    cases = {
        "bfloat16": lambda: F.scaled_dot_product_attention(*bf16, is_causal=True, enable_gqa=True),
        "float32": lambda q=[t.float() for t in bf16]: F.scaled_dot_product_attention(*q, is_causal=True, enable_gqa=True),
        "bf16 -> float32 -> bf16": lambda: F.scaled_dot_product_attention(
            *(t.float() for t in bf16), is_causal=True, enable_gqa=True
        ).to(torch.bfloat16),
    }
    for name, fn in tqdm(cases.items(), desc="dtypes"):
        fn()  # warm-up
        t = time.perf_counter()
        for _ in range(args.repeats):
            fn()
        ms = (time.perf_counter() - t) / args.repeats * 1e3
        tqdm.write(f"{name:>24}: {ms:7.1f} ms per layer, x{args.layers} layers = {ms * args.layers / 1e3:.2f} s")


if __name__ == "__main__":
    main()
