"""Chunked pipeline-prefill simulator: TTFT, bubble ratio, strong-scaling efficiency, timelines.

  python -m sglang.srt.tools.pp_sim run --preset h20-dsv31-tp8 --pp 4 --prompt-len 131072 --png t.png
  python -m sglang.srt.tools.pp_sim plan --preset h20-dsv31-tp8 --pp 2,4,8 --prompts 32768,1048576
  python -m sglang.srt.tools.pp_sim fit trace.json --measured-pp 2 -o model.json
  python -m sglang.srt.tools.pp_sim fit chunks.json --measured-pp 2 --isolated -o model.json
  python -m sglang.srt.tools.pp_sim validate --model model.json --measured ttft.json --pp 2 --policy fixed:512
  python -m sglang.srt.tools.pp_sim measure --chunks chunks.json --ttft-lens 1024,2048 --ttft ttft.json \\
      --engine-arg pp_size=2
A cost model comes from --preset, --coeffs a,b,c, --model FILE (from `fit`) or --fit FILES.
See docs/dynamic_chunking.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from sglang.srt.managers.dynamic_chunking import ChunkPolicy, FitError, TransferModel
from sglang.srt.tools.pp_sim_core import (
    StageCostModel,
    efficiency,
    plan_table,
    simulate_policy,
    single_stage_ttft,
)

# H20-class stage: DeepSeek-V3.1, TP8 per stage (one 8×H20 node). Shape from FLOP counts
# (MLA attention 5.0e6 FLOP per query-key pair over 61 layers; 37B active parameters), overall
# scale and per-forward overhead fitted to the blog's TTFTs at 128K (PP1 48.5 s, PP4 15.5 s,
# fixed 4096 chunks); p2p: 28.7 KB/token of hidden+residual over 8 × 400 Gb/s.
# How it was built: docs/notes/2026-11-dynamic-chunking.md.
PRESETS = {
    "h20-dsv31-tp8": StageCostModel(2.284e-9, 5.788e-5, 0.052, TransferModel(1e-4, 7.2e-8), "h20-dsv31-tp8"),
}


def _ints(text: str) -> list[int]:
    return [int(float(v)) for v in text.split(",") if v]


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cost model (one of)")
    g.add_argument("--preset", choices=sorted(PRESETS))
    g.add_argument("--coeffs", help="a,b,c: whole-model a, b and per-stage-forward c, in seconds")
    g.add_argument("--model", help="JSON written by `fit`")
    g.add_argument("--fit", nargs="+", metavar="FILE", help="trace / measurement files to fit")
    g.add_argument("--measured-pp", type=int, default=1, help="pp size the measurements were taken at")
    g.add_argument("--isolated", action="store_true", help="samples are whole-pipeline chunks (`measure`)")
    g.add_argument("--name-filter", default="", help="keep trace events whose name contains this")
    g.add_argument("--p2p-fixed-s", type=float, default=None)
    g.add_argument("--p2p-per-token-s", type=float, default=None)
    g.add_argument("--compute-scale", type=float, default=1.0, help="multiply a, b (another GPU)")
    g.add_argument("--overhead-scale", type=float, default=1.0, help="multiply c")


def _cost_model(args: argparse.Namespace) -> StageCostModel:
    if args.preset:
        cost = PRESETS[args.preset]
    elif args.coeffs:
        a, b, c = (float(v) for v in args.coeffs.split(","))
        cost = StageCostModel(a, b, c)
    elif args.model:
        with open(args.model, encoding="utf-8") as f:
            cost = StageCostModel.from_dict(json.load(f))
    elif args.fit:
        from sglang.srt.tools.pp_sim_trace import fit_cost_model, load_measurements

        ms = load_measurements(args.fit, args.name_filter)
        cost = fit_cost_model(ms, args.measured_pp, isolated=args.isolated)
    else:
        raise SystemExit("give a cost model: --preset, --coeffs, --model or --fit")
    fixed = cost.transfer.fixed_s if args.p2p_fixed_s is None else args.p2p_fixed_s
    per_tok = cost.transfer.per_token_s if args.p2p_per_token_s is None else args.p2p_per_token_s
    cost = StageCostModel(cost.a, cost.b, cost.c, TransferModel(fixed, per_tok), cost.name)
    return cost.scaled(args.compute_scale, args.overhead_scale)


def _policies(args: argparse.Namespace) -> list[ChunkPolicy]:
    texts = args.policy or [
        f"fixed:{args.chunk_size}",
        f"upstream:{args.chunk_size}:0.75",
        f"auto:{args.chunk_size}",
    ]
    return [ChunkPolicy.parse(t, args.page_size) for t in texts]


def _add_policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy", action="append", help="fixed:C | upstream:C[:alpha] | auto:C[:max_chunk]; repeat"
    )
    p.add_argument("--chunk-size", type=int, default=4096, help="C for the default policies and T1")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--async-depth", type=int, default=0, help="pp_async_batch_depth (ring = pp + depth)")


def cmd_run(args: argparse.Namespace) -> int:
    cost = _cost_model(args)
    partition = _ints(args.partition) if args.partition else None
    t1 = single_stage_ttft(cost, args.prompt_len, args.chunk_size, args.page_size)
    results = []
    for pol in _policies(args):
        r = simulate_policy(pol, cost, args.pp, args.prompt_len, args.prefix_len, partition, args.async_depth)
        results.append(r)
        row = {
            "policy": r.label,
            "chunks": len(r.chunks),
            "ttft_s": r.ttft,
            "bubble": r.bubble_ratio,
            "stage_bubble": r.stage_bubble,
            "efficiency": efficiency(t1, r),
            "chunk_sizes": r.chunks,
        }
        print(
            json.dumps(row)
            if args.json
            else f"{r.label:28s} chunks {len(r.chunks):4d}  TTFT {r.ttft:9.3f} s  bubble {100 * r.bubble_ratio:5.1f} %"
            f"  efficiency {100 * efficiency(t1, r):5.1f} %"
        )
    if args.png:
        from sglang.srt.tools.pp_sim_plot import draw_timelines

        title = f"pp={args.pp}, prompt {args.prompt_len} tokens, {cost.name or 'fitted model'}"
        print(f"timeline: {draw_timelines(results, args.png, title)}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    rows = plan_table(
        _cost_model(args),
        _ints(args.pp),
        _ints(args.prompts),
        _policies(args),
        args.chunk_size,
        args.async_depth,
    )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| prompt | pp | policy | chunks (first→last) | TTFT s | bubble | efficiency |")
    print("|---:|---:|---|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['prompt_len']} | {r['pp']} | {r['policy']} | {r['num_chunks']} ({r['first_chunk']}→"
            f"{r['last_chunk']}) | {r['ttft_s']:.2f} | {100 * r['bubble']:.1f} % | {100 * r['efficiency']:.1f} % |"
        )
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from sglang.srt.tools.pp_sim_trace import fit_cost_model, load_measurements

    ms = load_measurements(args.files, args.name_filter)
    transfer = TransferModel(args.p2p_fixed_s, args.p2p_per_token_s)
    cost = fit_cost_model(ms, args.measured_pp, transfer, args.name, args.isolated)
    text = json.dumps({**cost.to_dict(), "num_samples": len(ms), "measured_pp": args.measured_pp}, indent=1)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from sglang.srt.tools.pp_sim_trace import load_ttfts

    cost = _cost_model(args)
    (policy,) = _policies(args)[:1]
    worst = 0.0
    print(f"| prompt | measured TTFT s | predicted s | error |  ({policy.label}, pp={args.pp})")
    for n, measured in load_ttfts(args.measured):
        predicted = simulate_policy(policy, cost, args.pp, n, async_depth=args.async_depth).ttft
        err = (predicted - measured) / measured
        worst = max(worst, abs(err))
        print(f"| {n} | {measured:.3f} | {predicted:.3f} | {100 * err:+.1f} % |")
    print(f"worst |error| {100 * worst:.1f} % (tolerance {100 * args.tolerance:.0f} %)")
    return 0 if worst <= args.tolerance else 1


def cmd_measure(args: argparse.Namespace) -> int:
    import sglang as sgl
    from sglang.srt.tools.pp_sim_measure import default_points, measure_chunk_latencies, measure_ttft

    kwargs = {"log_level": "warning"}
    for kv in args.engine_arg or []:
        key, _, value = kv.partition("=")
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    with sgl.Engine(**kwargs) as engine:
        if args.chunks:
            pts = default_points(args.max_chunk, args.max_prefix, args.steps)
            ms = measure_chunk_latencies(engine, pts, args.repeats, args.vocab_max, stat=args.stat)
            with open(args.chunks, "w", encoding="utf-8") as f:
                json.dump([m.__dict__ for m in ms], f, indent=1)
            print(f"{len(ms)} chunk latencies → {args.chunks}")
        if args.ttft:
            rows = measure_ttft(engine, _ints(args.ttft_lens), args.repeats, args.vocab_max, stat=args.stat)
            with open(args.ttft, "w", encoding="utf-8") as f:
                json.dump(
                    {"ttft": [{"prompt_len": n, "ttft_s": t} for n, t in rows], "engine": kwargs}, f, indent=1
                )
            print("\n".join(f"TTFT {n}: {t:.3f} s" for n, t in rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m sglang.srt.tools.pp_sim", description=__doc__.splitlines()[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("run", help="simulate one prompt under each policy")
    _add_model_args(p)
    _add_policy_args(p)
    p.add_argument("--pp", type=int, required=True)
    p.add_argument("--prompt-len", type=int, required=True)
    p.add_argument("--prefix-len", type=int, default=0)
    p.add_argument("--partition", help="layers per stage, e.g. 15,15,15,16")
    p.add_argument("--png", help="write the pipeline timeline here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("plan", help="table over pp sizes × prompt lengths × policies")
    _add_model_args(p)
    _add_policy_args(p)
    p.add_argument("--pp", default="2,4,8")
    p.add_argument("--prompts", default="32768,131072,262144,524288,1048576")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("fit", help="fit a cost model from traces / measurements")
    p.add_argument("files", nargs="+")
    p.add_argument("--measured-pp", type=int, default=1)
    p.add_argument("--isolated", action="store_true", help="samples are whole-pipeline chunks (`measure`)")
    p.add_argument("--name-filter", default="")
    p.add_argument("--p2p-fixed-s", type=float, default=0.0)
    p.add_argument("--p2p-per-token-s", type=float, default=0.0)
    p.add_argument("--name", default="fitted")
    p.add_argument("-o", "--output")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("validate", help="predicted vs measured TTFT; exit 1 beyond tolerance")
    _add_model_args(p)
    _add_policy_args(p)
    p.add_argument("--measured", required=True, help="TTFT JSON (from `measure --ttft`)")
    p.add_argument("--pp", type=int, required=True)
    p.add_argument("--tolerance", type=float, default=0.15)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("measure", help="measure chunk latencies / TTFTs through sgl.Engine")
    p.add_argument("--engine-arg", action="append", help="ServerArgs field=value; repeat")
    p.add_argument("--chunks", help="write per-chunk latencies (JSON) here")
    p.add_argument("--max-chunk", type=int, default=1024)
    p.add_argument("--max-prefix", type=int, default=4096)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--ttft", help="write TTFTs (JSON) here")
    p.add_argument("--ttft-lens", default="1024,2048,4096")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vocab-max", type=int, default=10000)
    p.add_argument("--stat", choices=["median", "min"], default="median", help="summary of the repeats")
    p.set_defaults(func=cmd_measure)
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except FitError as exc:
        print(f"error: cannot fit a cost model: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
