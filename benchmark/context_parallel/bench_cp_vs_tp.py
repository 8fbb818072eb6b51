"""The seeds' thesis at equal ranks: context parallelism vs tensor parallelism for DSA prefill at
long context (issue 27; seed 000 claims CP beats TP because TP repeats the Lightning Indexer on
every rank while CP splits it).

The dummy DeepSeek-V3.2 of benchmark/dsa/run.py (2 layers, hidden 1024, 16 heads, latent 256+64,
indexer 16x64, index_topk 2048, float32, dense MLP), model only (no scheduler), the `dsa` backend,
one torch thread per rank, one prompt of `--tokens` tokens prefilled in one forward:
- cp 1: one rank;
- tp 2: two ranks, attention heads and MLP split (the indexer and its top-k replicated: each rank
  scores every query against every key);
- cp 2: two ranks, the prompt's tokens split zigzag (each rank scores its own queries).
Per rank: wall time, thread CPU time, and the time inside the indexer, the sparse attention and
the collectives (all-reduce / all-gather / the CP row exchange waits), so the breakdown shows
where TP repeats work. Prints a markdown table and, per length, prefill throughput
(tokens / slowest rank's time) of tp 2 and cp 2 over cp 1.

    python benchmark/context_parallel/bench_cp_vs_tp.py [--tokens 16384 32768] [--repeats 1] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dsa"))
from run import QUICK, SHAPE, _harness, _instrument, _setup, spawn  # noqa: E402

COMM = [
    ("sglang.srt.distributed.group_coordinator", "GroupCoordinator", "all_reduce"),
    ("sglang.srt.distributed.group_coordinator", "GroupCoordinator", "all_gather"),
    ("sglang.srt.distributed.group_coordinator", "GroupCoordinator", "reduce_scatter"),
    ("sglang.srt.layers.cp_exchange", "PendingGather", "wait"),
]


def _instrument_comm(totals: dict[str, float]) -> None:
    import importlib

    for module_name, cls_name, attr in COMM:
        owner = getattr(importlib.import_module(module_name), cls_name)
        fn = getattr(owner, attr)

        def timed(*args, __fn=fn, **kwargs):
            start = time.perf_counter()
            try:
                return __fn(*args, **kwargs)
            finally:
                totals["comm"] += time.perf_counter() - start

        setattr(owner, attr, timed)


def _prefill_rank(rank, world, port, shape, topk, tokens, repeats, mode, out) -> None:
    import torch

    cfg, groups, model = _setup(rank, world, port, shape, topk, mode)
    totals: dict[str, float] = defaultdict(float)
    _instrument(totals)
    _instrument_comm(totals)
    ids = torch.randint(3, cfg.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    runs = []
    for i in range(repeats + 1):  # the first, short prefill is a warm-up
        h = _harness(cfg, groups, model, "dsa", tokens)
        groups.tp.barrier()
        totals.clear()
        start, cpu = time.perf_counter(), time.thread_time()
        h.forward(model, [(h.new_request(), ids if i else ids[:512])])
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
        groups.tp.barrier()
        if i:
            runs.append(
                {"time": elapsed, "cpu": cpu, **{k: totals[k] for k in ("indexer", "sparse", "comm")}}
            )
    out.put((rank, min(runs, key=lambda r: r["time"])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[16384, 32768])
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1K tokens, index_topk 128, 1 layer")
    args = ap.parse_args()
    shape, token_list, topk = dict(SHAPE), args.tokens, args.topk
    if args.quick:
        shape.update(QUICK)
        token_list, topk = [1024], 128
    plan = [
        (n, name, world, mode)
        for n in token_list
        for name, world, mode in (("cp1", 1, "cp"), ("tp2", 2, "tp"), ("cp2", 2, "cp"))
    ]
    results: dict[tuple[int, str], list[dict]] = {}
    for n, name, world, mode in tqdm(plan, desc="cp vs tp", unit="run"):
        results[(n, name)] = spawn(_prefill_rank, world, shape, topk, n, args.repeats, mode)
        print(f"  {n} {name}: " + ", ".join(f"{r['time']:.3f} s" for r in results[(n, name)]), flush=True)
    print(
        f"\nDeepSeek-V3.2 dummy ({shape['num_hidden_layers']} layers), index_topk {topk}, float32, dsa backend, "
        "1 torch thread per rank\n"
    )
    print(
        "| tokens | layout | rank | time (s) | thread CPU (s) | indexer (s) | sparse attention (s) | collectives (s) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for (n, name), ranks in results.items():
        for r, x in enumerate(ranks):
            print(
                f"| {n} | {name} | {r} | {x['time']:.3f} | {x['cpu']:.3f} | {x['indexer']:.3f} | "
                f"{x['sparse']:.3f} | {x['comm']:.3f} |"
            )
    print()
    for n in token_list:
        one = results[(n, "cp1")][0]["time"]
        tp2 = max(r["time"] for r in results[(n, "tp2")])
        cp2 = max(r["time"] for r in results[(n, "cp2")])
        print(
            f"- {n}: prefill throughput over cp 1: tp 2 {one / tp2:.2f}x, cp 2 {one / cp2:.2f}x; "
            f"cp 2 / tp 2 = {tp2 / cp2:.2f}x"
        )


if __name__ == "__main__":
    main()
