"""Causal prefill attention of one layer on CPU: torch's flash kernel in bf16, in float32, and on
bf16 inputs run in float32 (what `CpuPlatform.prefill_attention_dtype` picks on CPUs without AMX),
against our fused float32 kernel (`prefill_attention_vec`, each vector build this CPU runs) on
float32 and bf16 inputs. SmolLM2 shape by default (9 query heads, 3 KV heads, head dim 64).

    .venv/bin/python benchmark/vs_vllm/sdpa_dtype.py --threads 2 --tokens 4096
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from sglang.srt.kernels.cpu import isa, loader


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
    n, d = args.tokens, args.head_dim
    shapes = [(1, h, n, d) for h in (args.heads, args.kv_heads, args.kv_heads)]
    bf16 = [torch.randn(s, generator=g).to(torch.bfloat16) for s in shapes]
    f32 = [t.float() for t in bf16]
    rows_bf16 = [t[0].transpose(0, 1).contiguous() for t in bf16]  # [n, heads, D] as the backend passes them
    rows_f32 = [t[0].transpose(0, 1).contiguous() for t in f32]
    scale = d**-0.5
    cases = {
        "SDPA bfloat16": lambda: F.scaled_dot_product_attention(*bf16, is_causal=True, enable_gqa=True),
        "SDPA float32": lambda: F.scaled_dot_product_attention(*f32, is_causal=True, enable_gqa=True),
        "SDPA bf16 -> float32 -> bf16": lambda: F.scaled_dot_product_attention(
            *(t.float() for t in bf16), is_causal=True, enable_gqa=True
        ).to(torch.bfloat16),
    }
    for variant in isa.runnable_variants():
        module = loader.load_variant(variant.name).module
        if module is None or not module.prefill_attention_vec_supported():
            continue
        cases[f"prefill_attention_vec [{variant.name}] float32"] = lambda m=module: m.prefill_attention_vec(
            *rows_f32, scale
        )
        cases[f"prefill_attention_vec [{variant.name}] bf16"] = lambda m=module: m.prefill_attention_vec(
            *rows_bf16, scale
        )
    flop = 4 * (n * (n + 1) / 2) * d * args.heads  # QK^T and PV over the causal half
    for name, fn in tqdm(cases.items(), desc="cases"):
        fn()  # warm-up
        best = float("inf")
        for _ in range(args.repeats):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        ms = best * 1e3
        tqdm.write(
            f"{name:>40}: {ms:7.1f} ms per layer ({flop / best / 1e9:5.0f} GFLOP/s), "
            f"x{args.layers} layers = {ms * args.layers / 1e3:.2f} s"
        )


if __name__ == "__main__":
    main()
