"""Adaptive CP (`--cp-min-split-tokens`): TTFT of short and long prompts at cp 1, at cp 2 always
split (`--cp-min-split-tokens 0`, the static split) and at cp 2 with a threshold, one torch thread
per rank, on the SmolLM2-shaped dummy Llama of bench_cp_prefill.py.

For each prompt length, each configuration's engine runs `--repeats` prompts of that length (after
a warm-up) and the median TTFT is kept; the table gives each cp 2 column over cp 1. The crossover
where the split starts to pay is the length to pass as --cp-min-split-tokens (the platform default
is set from it: platforms/*.py `cp_min_split_tokens`).

    python benchmark/context_parallel/bench_cp_adaptive.py [--tokens 256 512 2048 4096 16384] \
        [--threshold 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cp_prefill import run_engine, write_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[256, 512, 2048, 4096, 16384])
    ap.add_argument("--threshold", type=int, default=None, help="cp 2 adaptive: --cp-min-split-tokens")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    configs = {"cp1": (1, {}), "cp2 split": (2, {"cp_min_split_tokens": 0})}
    if args.threshold is not None:
        configs[f"cp2 min {args.threshold}"] = (2, {"cp_min_split_tokens": args.threshold})
    rows = []
    with tempfile.TemporaryDirectory() as root:
        path = write_config(root)
        for n in args.tokens:
            ttft = {}
            for name, (cp, extra) in configs.items():
                times, _ = run_engine(path, cp, 1, n, args.repeats, args.dtype, **extra)
                ttft[name] = statistics.median(times)
                print(
                    f"tokens={n} {name}: TTFT {ttft[name] * 1e3:.1f} ms (runs "
                    + ", ".join(f"{t * 1e3:.1f}" for t in times)
                    + ")",
                    flush=True,
                )
            rows.append((n, ttft))
    names = list(configs)
    print(
        "\n| tokens | "
        + " | ".join(f"{k} TTFT ms" for k in names)
        + " | "
        + " | ".join(f"{k} / cp1" for k in names[1:])
        + " |"
    )
    print("|---:|" + "---:|" * (2 * len(names) - 1))
    for n, ttft in rows:
        print(
            f"| {n} | "
            + " | ".join(f"{ttft[k] * 1e3:.1f}" for k in names)
            + " | "
            + " | ".join(f"{ttft[k] / ttft['cp1']:.2f}" for k in names[1:])
            + " |"
        )


if __name__ == "__main__":
    main()
