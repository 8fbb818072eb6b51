"""Shard Linear at cp 2: weight bytes per rank and prefill time, on vs off.

The dummy DeepSeek-V3.2 of `run.py` (hidden 1024, 16 heads, q-LoRA 384, kv-LoRA 256 + 64, indexer
16 x 64, index_topk 2048, float32, dense MLP) with `--layers` layers (default 8: with 2 layers each
rank owns one layer and borrows the other through a window, which saves nothing), one prompt of
`--tokens` prefilled in one forward per rank on the `dsa` backend, zigzag, one torch thread per
rank. Reports per rank: all parameter bytes, the q_b_proj + o_proj bytes held (owned + windows),
prefill wall time and thread CPU time (best of `--repeats`).

    python benchmark/dsa/shard_linear.py [--layers 8] [--tokens 4096] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import SHAPE, _harness, _setup, spawn  # noqa: E402


def _rank(rank, cp, port, shape, topk, tokens, repeats, shard, out) -> None:
    import torch

    cfg, groups, model = _setup(rank, cp, port, shape, topk)
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    series_full = sum(
        m.weight.numel() * m.weight.element_size()
        for layer in model.model._stage_layers
        for m in (layer.self_attn.q_b_proj, layer.self_attn.o_proj)
    )
    series = model.enable_shard_linear() if shard else None
    ids = torch.randint(3, cfg.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    runs = []
    for i in range(repeats + 1):
        h = _harness(cfg, groups, model, "dsa", tokens)
        groups.attn_cp.barrier()
        start, cpu = time.perf_counter(), time.thread_time()
        h.forward(model, [(h.new_request(), ids if i else ids[:512])])
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
        groups.attn_cp.barrier()
        if i:
            runs.append((elapsed, cpu))
    best = min(runs)
    params = sum(p.numel() * p.element_size() for p in model.parameters())  # owned weights only
    held = series.weight_bytes() if series else series_full  # series: owned + windows
    windows = held - (series_full - (full - params))
    all_held = params + windows
    out.put(
        (
            rank,
            {
                "time": best[0],
                "cpu": best[1],
                "params": all_held,
                "params_full": full,
                "series": held,
                "series_full": series_full,
                "broadcasts": series.broadcasts if series else 0,
            },
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    shape = {**SHAPE, "num_hidden_layers": args.layers, "first_k_dense_replace": args.layers}
    res = {}
    for shard in tqdm((False, True), desc="shard linear", unit="run"):
        res[shard] = spawn(_rank, 2, shape, 2048, args.tokens, args.repeats, shard)
    print(
        f"\nShard Linear, cp 2, {args.layers} layers, {args.tokens}-token prefill, float32, 1 thread per rank\n"
    )
    print(
        "| Shard Linear | rank | all params (MiB) | q_b_proj + o_proj held (MiB) | prefill (s) | thread CPU (s) | broadcasts |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    mib = 2**20
    for shard in (False, True):
        for r, x in enumerate(res[shard]):
            print(
                f"| {'on' if shard else 'off'} | {r} | {x['params'] / mib:.1f} | {x['series'] / mib:.1f} | "
                f"{x['time']:.2f} | {x['cpu']:.2f} | {x['broadcasts']} |"
            )


if __name__ == "__main__":
    main()
