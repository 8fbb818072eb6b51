"""Offline throughput: `sgl.Engine` over a dataset, all prompts submitted as one batch.

  python -m sglang.bench_offline_throughput --model-path MODEL --dataset-name random \
      --num-prompts 16 --random-input-len 16 --random-output-len 64 --random-range-ratio 1.0

Every launch_server flag is accepted (it configures the Engine). Prompts with known token ids are
sent as `input_ids`, so the engine sees exactly the dataset's lengths. A short warm-up request runs
first (unless `--skip-warmup`) and the prefix cache is flushed before the timed run. Prints SGLang's
"Offline Throughput Benchmark Result" block; `--result-filename` appends one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Optional

from sglang.benchmark.datasets import DatasetRow, add_dataset_args, get_dataset
from sglang.srt.server_args import ServerArgs

WIDTH = 50


def parse_args(argv: Optional[list[str]] = None) -> tuple[argparse.Namespace, ServerArgs]:
    p = argparse.ArgumentParser(
        prog="python -m sglang.bench_offline_throughput", description=__doc__.splitlines()[0]
    )
    ServerArgs.add_cli_args(p)
    add_dataset_args(p)
    p.add_argument("--backend", default="engine", choices=["engine"])
    p.add_argument("--disable-ignore-eos", action="store_true")
    p.add_argument("--skip-warmup", action="store_true")
    p.add_argument("--result-filename", default=None, help="append one JSON line with the results")
    args = p.parse_args(argv)
    return args, ServerArgs.from_cli_args(args)


def _line(label: str, value) -> str:
    fmt = "{:<40} {:<10.2f}" if isinstance(value, float) else "{:<40} {:<10}"
    return fmt.format(label, value)


def format_result(result: dict) -> str:
    lines = [
        "{s:{c}^{n}}".format(s=" Offline Throughput Benchmark Result ", n=WIDTH, c="="),
        _line("Backend:", result["backend"]),
        _line("Successful requests:", result["successful_requests"]),
        _line("Benchmark duration (s):", result["total_latency"]),
        _line("Total input tokens:", result["total_input_tokens"]),
        _line("Total generated tokens:", result["total_output_tokens"]),
        _line("Request throughput (req/s):", result["request_throughput"]),
        _line("Input token throughput (tok/s):", result["input_throughput"]),
        _line("Output token throughput (tok/s):", result["output_throughput"]),
        _line("Total token throughput (tok/s):", result["total_throughput"]),
        "=" * WIDTH,
    ]
    return "\n".join(lines)


def throughput_run(engine, rows: list[DatasetRow], ignore_eos: bool) -> dict:
    """Generate every row in one batch; token counts are the engine's own."""
    params = [{"temperature": 0.0, "max_new_tokens": r.output_len, "ignore_eos": ignore_eos} for r in rows]
    use_ids = all(r.prompt_ids for r in rows)
    start = time.perf_counter()
    if use_ids:
        outs = engine.generate(input_ids=[r.prompt_ids for r in rows], sampling_params=params)
    else:
        outs = engine.generate(prompt=[r.prompt for r in rows], sampling_params=params)
    latency = time.perf_counter() - start
    outs = outs if isinstance(outs, list) else [outs]
    ok = [o for o in outs if (o["meta_info"]["finish_reason"] or {}).get("type") != "abort"]
    n_in = sum(o["meta_info"]["prompt_tokens"] for o in ok)
    n_out = sum(o["meta_info"]["completion_tokens"] for o in ok)
    return {
        "backend": "engine",
        "successful_requests": len(ok),
        "total_latency": latency,
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "request_throughput": len(ok) / latency,
        "input_throughput": n_in / latency,
        "output_throughput": n_out / latency,
        "total_throughput": (n_in + n_out) / latency,
    }


def run(args: argparse.Namespace, server_args: ServerArgs) -> dict:
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    tokenizer = get_tokenizer(server_args.tokenizer_path, server_args.trust_remote_code)
    rows = get_dataset(args, tokenizer)
    with Engine(**{f.name: getattr(server_args, f.name) for f in dataclasses.fields(server_args)}) as engine:
        if not args.skip_warmup:
            engine.generate(input_ids=rows[0].prompt_ids or [1, 2, 3], sampling_params={"max_new_tokens": 4})
        engine.flush_cache()
        result = throughput_run(engine, rows, not args.disable_ignore_eos)
    result.update(
        model_path=server_args.model_path,
        dataset_name=args.dataset_name,
        num_prompts=len(rows),
        seed=args.seed,
        random_input_len=args.random_input_len,
        random_output_len=args.random_output_len,
    )
    print(format_result(result))
    if args.result_filename:
        with open(args.result_filename, "a", encoding="utf-8") as f:
            f.write(json.dumps(result) + "\n")
    return result


def main(argv: Optional[list[str]] = None) -> int:
    args, server_args = parse_args(argv)
    result = run(args, server_args)
    return 0 if result["successful_requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
