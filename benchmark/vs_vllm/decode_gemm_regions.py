"""What one OpenMP region costs a decode step: the bf16 linears of a batch-8 step, per wait policy.

    .venv/bin/python benchmark/vs_vllm/decode_gemm_regions.py

SmolLM2-135M's four layer linears (qkv 576 -> 960, o 576 -> 576, gate_up 576 -> 3072, down
1536 -> 576) at `--rows` rows (a decode batch), bf16, through oneDNN's packed linear (what the
server runs) and our `linear_f32out_packed` kernel (the LM head's), with 30 layers' weights used
in turn so that each call reads its weight from memory. Each configuration runs in a process of
its own (libgomp reads OMP_WAIT_POLICY once): `--threads` threads with OMP_WAIT_POLICY=PASSIVE
(threads sleep between regions: each region wakes them) and ACTIVE (they spin), and one thread.
Prints µs per call (mean of `--rounds` rounds, fastest round) next to the weight-read floor at
`--bandwidth` GB/s. The gap between PASSIVE and ACTIVE is the wake-up cost of one region.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]
LAYERS = 30


def worker(args) -> None:
    import torch

    from sglang.srt.kernels.cpu import loader
    from sglang.srt.layers.linear_float32_out import pack_bf16_pairs

    torch.set_num_threads(args.threads)
    ops = loader.load()
    mk = torch.ops.mkldnn
    out = {}
    for k, n in SHAPES:
        ws = [torch.randn(n, k).to(torch.bfloat16) for _ in range(LAYERS)]
        x = torch.randn(args.rows, k).to(torch.bfloat16)
        fns = {
            "oneDNN": lambda i, p=[mk._reorder_linear_weight(w.contiguous(), None) for w in ws]: (
                mk._linear_pointwise(x, p[i % LAYERS], None, "none", [], "")
            )
        }
        if ops is not None:
            xf = x.float()
            fns["f32out_packed"] = lambda i, p=[pack_bf16_pairs(w) for w in ws], n=n: (
                ops.linear_f32out_packed(xf, p[i % LAYERS], n, None)
            )
        for name, fn in fns.items():
            times = []
            for _ in range(args.rounds):
                fn(0)
                t = time.perf_counter()
                for i in range(args.calls):
                    fn(i)
                times.append((time.perf_counter() - t) / args.calls * 1e6)
            out[f"{k} -> {n} {name}"] = (sum(times) / len(times), min(times))
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--bandwidth", type=float, default=45.0, help="GB/s for the weight-read floor")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    configs = [
        (f"{args.threads} threads, PASSIVE", args.threads, "PASSIVE"),
        (f"{args.threads} threads, ACTIVE", args.threads, "ACTIVE"),
        ("1 thread", 1, "PASSIVE"),
    ]
    results = {}
    for label, threads, policy in configs:
        cmd = [sys.executable, __file__, "--worker", "--threads", str(threads), "--rows", str(args.rows)]
        cmd += ["--rounds", str(args.rounds), "--calls", str(args.calls)]
        env = {**os.environ, "OMP_WAIT_POLICY": policy}
        res = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
        results[label] = json.loads(res.stdout.splitlines()[-1])
    labels = list(results)
    print(
        f"\n| linear, {args.rows} rows, bf16 (µs per call: mean (fastest round)) | floor | {' | '.join(labels)} |"
    )
    print("|---|---:|" + "---:|" * len(labels))
    for key in results[labels[0]]:
        k, n = (int(v) for v in key.split(" ")[0:3:2])
        floor = n * k * 2 / (args.bandwidth * 1e3)
        cells = [f"{results[lb][key][0]:.1f} ({results[lb][key][1]:.1f})" for lb in labels]
        print(f"| {key} | {floor:.0f} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
