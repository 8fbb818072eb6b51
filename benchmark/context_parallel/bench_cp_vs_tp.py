"""The seeds' thesis at equal ranks: context parallelism vs tensor and pipeline parallelism for DSA
at long context (issue 27; seed 000 claims CP beats TP because TP repeats the Lightning Indexer on
every rank while CP splits it).

The dummy DeepSeek-V3.2 of benchmark/dsa/run.py (2 layers, hidden 1024, 16 heads, latent 256+64,
indexer 16x64, index_topk 2048, float32, dense MLP), the `dsa` backend, one torch thread per rank.
Every row is measured the same way: the model alone on spawned gloo ranks (CPForwardHarness, no
scheduler, no engine), rank code in cp_vs_tp_ranks.py. Layouts (`--layouts`):
- cp1: one rank, the prompt in one forward;
- tp2: two ranks, attention heads and MLP split (the indexer and its top-k replicated: each rank
  scores every query against every key), one forward;
- cp2: two ranks, the prompt's tokens split zigzag (each rank scores its own queries), one forward;
- pp2: two ranks, one layer per stage; the prompt prefilled in chunks of `--pp-chunk` tokens over
  the cached prefix, pipelined (stage 1 runs chunk i while stage 0 runs chunk i+1; sends
  asynchronous, at most 2 in flight, as the engine's ring);
- cp1-chunked: one rank, the prompt in chunks of `--pp-chunk` (what chunking alone costs; pp2's
  one-rank reference).

Prefill (`--tokens`): best of `--repeats` after a short warm-up; TTFT = the slowest rank's time,
throughput = tokens / TTFT. Decode (`--decode-batch B --decode-context L`): B requests each holding
L cached tokens (the pool sized to exactly that, plus room for the steps: full), the rows random
instead of a prefill (benchmark/dsa/run.py's `decode_pool`: a step's cost does not depend on where
the rows came from), then `--decode-steps` timed steps, the median reported; tokens/s = B / the
slowest rank's median step. pp2 decodes the batch as 2 micro-batches kept in flight (stage 0 runs
a micro-batch's next step once stage 1 has returned its ids), a step = one round of both.

Per rank: wall time, thread CPU time, and the time inside the indexer, the sparse attention,
communication (collectives, the CP row exchange, pipeline receives / send waits, so a rank's wait
for its peer is here) and the rest ("other": projections, MLP, norms, LM head).

    python benchmark/context_parallel/bench_cp_vs_tp.py [--tokens 16384 32768] [--repeats 1]
        [--layouts cp1 tp2 cp2 pp2] [--pp-chunk 4096] [--decode-batch 64 --decode-context 32768] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dsa"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cp_vs_tp_ranks import decode_rank, prefill_rank  # noqa: E402
from run import SHAPE, spawn  # noqa: E402

# name: (ranks, run.py _setup mode, chunked prefill)
LAYOUTS = {
    "cp1": (1, "cp", False),
    "tp2": (2, "tp", False),
    "cp2": (2, "cp", False),
    "pp2": (2, "pp", True),
    "cp1-chunked": (1, "pp", True),
}
PARTS_HEADER = "thread CPU (s) | indexer (s) | sparse attention (s) | comm (s) | other (s)"


def _parts(x: dict, scale: float = 1.0) -> str:
    return " | ".join(f"{x[k] * scale:.3f}" for k in ("cpu", "indexer", "sparse", "comm", "other"))


def _ratio(results: dict, key, a: str, b: str, better) -> str:
    if (*key, a) not in results or (*key, b) not in results:
        return "n/a"
    return f"{better(results[(*key, a)], results[(*key, b)]):.2f}x"


def _slowest(ranks: list[dict], field: str = "time") -> float:
    return max(r[field] for r in ranks)


def print_prefill(results: dict, n: int, layouts: list[str]) -> None:
    print(f"\n### Prefill, {n} tokens\n")
    print(f"| layout | rank | time (s) | {PARTS_HEADER} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in layouts:
        for r, x in enumerate(results[("prefill", n, name)]):
            print(f"| {name} | {r} | {x['time']:.3f} | {_parts(x)} |")
    print("\n| layout | TTFT (s) | throughput (tokens/s) | busiest thread CPU (s) | throughput / cp1 |")
    print("|---|---:|---:|---:|---:|")
    base = results.get(("prefill", n, "cp1"))
    for name in layouts:
        ranks = results[("prefill", n, name)]
        ttft = _slowest(ranks)
        rel = f"{_slowest(base) / ttft:.2f}x" if base else "n/a"
        print(f"| {name} | {ttft:.3f} | {n / ttft:.0f} | {_slowest(ranks, 'cpu'):.3f} | {rel} |")
    key = ("prefill", n)
    wall = lambda a, b: _slowest(b) / _slowest(a)  # noqa: E731  (throughput a / throughput b)
    cpu = lambda a, b: _slowest(b, "cpu") / _slowest(a, "cpu")  # noqa: E731
    print(
        f"\n- {n}: prefill throughput cp2/tp2 = {_ratio(results, key, 'cp2', 'tp2', wall)} "
        f"(busiest thread CPU {_ratio(results, key, 'cp2', 'tp2', cpu)}), "
        f"cp2/pp2 = {_ratio(results, key, 'cp2', 'pp2', wall)} "
        f"(busiest thread CPU {_ratio(results, key, 'cp2', 'pp2', cpu)})"
    )


def print_decode(results: dict, batch: int, context: int, layouts: list[str]) -> None:
    print(f"\n### Decode, batch {batch} at {context} tokens each (median step)\n")
    print(
        f"| layout | rank | step (ms) | decode tokens/s | KV pool (GiB) | {PARTS_HEADER.replace('(s)', '(ms)')} |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in layouts:
        ranks = results[("decode", name)]
        rate = batch / _slowest(ranks)
        for r, x in enumerate(ranks):
            print(
                f"| {name} | {r} | {x['time'] * 1e3:.1f} | {rate:.1f} | {x['kv_bytes'] / 2**30:.2f} | "
                f"{_parts(x, 1e3)} |"
            )
    key = ("decode",)
    rate = lambda a, b: _slowest(b) / _slowest(a)  # noqa: E731
    print(
        f"\n- decode tokens/s cp2/tp2 = {_ratio(results, key, 'cp2', 'tp2', rate)}, "
        f"cp2/pp2 = {_ratio(results, key, 'cp2', 'pp2', rate)}, "
        f"cp2/cp1 = {_ratio(results, key, 'cp2', 'cp1', rate)}"
    )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[16384, 32768], help="prompt lengths")
    ap.add_argument("--topk", type=int, default=2048, help="index_topk of the dummy model")
    ap.add_argument("--repeats", type=int, default=1, help="timed prefills per layout (best kept)")
    ap.add_argument(
        "--layouts", nargs="+", default=["cp1", "tp2", "cp2", "pp2"], help="from: " + ", ".join(LAYOUTS)
    )
    ap.add_argument("--pp-chunk", type=int, default=4096, help="chunk tokens of pp2 and cp1-chunked prefill")
    ap.add_argument("--decode-batch", type=int, default=0, help="decode requests (0: no decode runs)")
    ap.add_argument("--decode-context", type=int, default=32768, help="cached tokens per decode request")
    ap.add_argument("--decode-steps", type=int, default=5, help="timed decode steps (median reported)")
    ap.add_argument("--json", help="also write every rank's figures to this file (input of tools/cp_sim.py)")
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: 1K-token prefill, 4 x 1K decode, index_topk 128"
    )
    args = ap.parse_args()
    bad = [x for x in args.layouts if x not in LAYOUTS]
    if bad:
        ap.error(f"--layouts: unknown {bad}; choose from {list(LAYOUTS)}")
    for flag in ("pp_chunk", "decode_context", "decode_steps"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.decode_batch < 0 or any(n < 1 for n in args.tokens):
        ap.error("--decode-batch must be >= 0 and every --tokens value >= 1")
    if args.quick:
        args.tokens, args.topk, args.pp_chunk = [1024], 128, 256
        args.decode_batch, args.decode_context, args.decode_steps = 4, 1024, 3
    return args


def main() -> None:
    args = parse_args()
    longest = max([*args.tokens, args.decode_context + 2 * args.decode_steps + 64])
    shape = {**SHAPE, "max_position_embeddings": max(SHAPE["max_position_embeddings"], longest + 4096)}
    plan = [("prefill", n, name) for n in args.tokens for name in args.layouts]
    if args.decode_batch:
        plan += [("decode", name) for name in args.layouts if name != "cp1-chunked"]
    results: dict[tuple, list[dict]] = {}
    for key in tqdm(plan, desc="cp vs tp vs pp", unit="run"):
        world, mode, chunked = LAYOUTS[key[-1]]
        if key[0] == "prefill":
            chunk = args.pp_chunk if chunked else 0
            results[key] = spawn(prefill_rank, world, shape, args.topk, key[1], args.repeats, mode, chunk)
        else:
            results[key] = spawn(
                decode_rank,
                world,
                shape,
                args.topk,
                args.decode_context,
                args.decode_batch,
                args.decode_steps,
                mode,
            )
        tqdm.write(f"  {' '.join(map(str, key))}: " + ", ".join(f"{r['time']:.3f} s" for r in results[key]))
    print(
        f"\nDeepSeek-V3.2 dummy ({shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
        f"16 heads, latent 256+64, indexer 16x64), index_topk {args.topk}, float32, dsa backend, model only, "
        f"1 torch thread per rank; pp2 / cp1-chunked prefill chunk {args.pp_chunk}"
    )
    for n in args.tokens:
        print_prefill(results, n, args.layouts)
    if args.decode_batch:
        print_decode(
            results, args.decode_batch, args.decode_context, [x for x in args.layouts if x != "cp1-chunked"]
        )
    if args.json:
        write_json(args.json, shape, args.topk, results)


def write_json(path: str, shape: dict, topk: int, results: dict) -> None:
    """Per run: kind, tokens (prefill) or batch/context (decode), layout and each rank's figures."""
    runs = [
        {"kind": key[0], "tokens": key[1] if key[0] == "prefill" else None, "layout": key[-1], "ranks": ranks}
        for key, ranks in results.items()
    ]
    with open(path, "w") as f:
        json.dump({"shape": shape, "topk": topk, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
