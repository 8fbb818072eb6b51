"""One benchmark command on two source trees, interleaved, in one run: is a change neutral?

  .venv/bin/python benchmark/foundation/trees_ab.py --tree before=/work/wt-before --tree after=. \
      --variant after-bf16-head=after:--disable-fp32-lm-head --rounds 3 -- \
      -m sglang.bench_one_batch --dtype bfloat16 --batch-size 16 --input-len 256 --output-len 32

Each round runs every tree (and variant) once, in turn, with PYTHONPATH set to that tree's
`python/` and `sgl-kernel-npu/python/` (each tree needs its own kernel builds in place). The
command must accept `--result-filename` (sglang.bench_one_batch does); the script appends it and
reads the JSON lines back. Prints, per metric, each tree's median over the rounds and its ratio to
the first tree. A ratio inside the spread of the rounds is noise, not a difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

METRICS = ("prefill_latency", "median_decode_latency", "total_latency")


def _run(tree: Path, cmd: list[str], extra: list[str], out: Path) -> None:
    paths = [str(tree / "python"), str(tree / "sgl-kernel-npu" / "python")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    full = [sys.executable, *cmd, *extra, "--result-filename", str(out)]
    done = subprocess.run(full, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(full)}\n{done.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH (the first is the baseline)")
    ap.add_argument(
        "--variant", action="append", default=[], help="NAME=TREE:ARG[,ARG]: a tree's run with extra args"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command after `python`")
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    trees = dict(t.split("=", 1) for t in args.tree)
    runs = {name: (Path(path).resolve(), []) for name, path in trees.items()}
    for v in args.variant:
        name, spec = v.split("=", 1)
        base, extra = spec.split(":", 1)
        runs[name] = (Path(trees[base]).resolve(), extra.split(","))
    results: dict[str, list[dict]] = {name: [] for name in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, (tree, extra) in runs.items():
                out = Path(tmp) / f"{name}-{r}.jsonl"
                _run(tree, cmd, extra, out)
                results[name] += [json.loads(line) for line in out.read_text().splitlines()]
                print(f"round {r + 1}/{args.rounds} {name}: done (load {os.getloadavg()[0]:.2f})", flush=True)
    base = next(iter(results))
    print(f"\n{'run':>18} " + " ".join(f"{m:>30}" for m in METRICS))
    for name, rows in results.items():
        cells = []
        for m in METRICS:
            vals = [row[m] for row in rows if m in row]
            ref = [row[m] for row in results[base] if m in row]
            if not vals:
                cells.append(f"{'-':>30}")
                continue
            med, spread = statistics.median(vals), (max(vals) - min(vals)) / statistics.median(vals)
            ratio = med / statistics.median(ref)
            cells.append(f"{med * 1e3:9.1f} ms x{ratio:5.3f} (+-{spread / 2:4.0%})")
        print(f"{name:>18} " + " ".join(f"{c:>30}" for c in cells))


if __name__ == "__main__":
    main()
