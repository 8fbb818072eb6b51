"""Workload (c) through our offline API, `sgl.Engine` (the counterpart of vllm_offline.py).

  .venv/bin/python benchmark/vs_vllm/ours_offline.py --model HF_DIR --prompts prompts.json --result out.json

Same prompt ids, greedy, ignore_eos; one warm-up generate, then `--repeats` timed generates of the
whole batch (prefix cache flushed before each); writes the output tokens/s of each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--engine-args", default="", help="extra launch_server flags, e.g. '--num-threads 2'")
    args = ap.parse_args()

    from sglang.bench_offline_throughput import throughput_run
    from sglang.benchmark.datasets import DatasetRow
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.server_args import prepare_server_args

    with open(args.prompts) as f:
        rows = [
            DatasetRow("", len(r["prompt_ids"]), r["output_len"], r["prompt_ids"])
            for r in json.load(f)["prompts"]
        ]
    server_args = prepare_server_args(
        [
            "--model-path",
            args.model,
            "--dtype",
            args.dtype,
            "--log-level",
            "warning",
            *shlex.split(args.engine_args),
        ]
    )
    runs = []
    with Engine(**{f.name: getattr(server_args, f.name) for f in dataclasses.fields(server_args)}) as engine:
        throughput_run(engine, rows[:1], ignore_eos=True)
        for _ in range(args.repeats):
            engine.flush_cache()
            runs.append(throughput_run(engine, rows, ignore_eos=True)["output_throughput"])
    with open(args.result, "w") as f:
        json.dump({"output_throughput": statistics.median(runs), "runs": runs}, f)
    print(f"ours offline: {statistics.median(runs):.1f} output tokens/s, runs {[round(r, 1) for r in runs]}")


if __name__ == "__main__":
    main()
