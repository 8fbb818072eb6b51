"""A/B of CPU kernel builds: every fused op, several builds, alternating rounds in one run.

    .venv/bin/python benchmark/foundation/cpu_kernel_builds.py --build avx512 --build avx2 --build generic
    .venv/bin/python benchmark/foundation/cpu_kernel_builds.py --build /tmp/old/sglang_cpu_ops.so --build avx512

A build is an ISA variant of this tree's install-time build (kernels/cpu/isa.py) or the path of
another kernel module (.so). Shapes are SmolLM2-135M's (hidden 576, 9 query / 3 KV heads of 64,
intermediate 1536): the elementwise ops at a 4096-token prefill, decode attention for 16 requests
at 1024 tokens of context each, AMX prefill attention for one 4096-token sequence (where a build
and the CPU have it). Each round times every op on every build (`--iters` calls after warm-up);
the table shows each build's fastest call over all rounds, in ms: on a shared machine the minimum
is the figure other processes disturb least. 2 threads unless `--threads`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

import torch
from tqdm import tqdm


def load(build: str):
    if build.endswith(".so"):
        name = os.path.basename(build).split(".")[0]
        spec = importlib.util.spec_from_file_location(name, build)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    from sglang.srt.kernels.cpu import loader

    result = loader.load_variant(build)
    if result.module is None:
        raise SystemExit(result.reason)
    return result.module


def fastest_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def workloads(ops, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(0)
    gate_up = torch.randn(4096, 2 * 1536, generator=g).to(dtype)
    x = torch.randn(4096, 576, generator=g).to(dtype)
    res = torch.randn(4096, 576, generator=g).to(dtype)
    w = torch.rand(576, generator=g).to(dtype)
    qkv = torch.randn(4096, 15 * 64, generator=g).to(dtype)
    q3 = qkv[:, : 9 * 64].view(4096, 9, 64)
    cos, sin = torch.randn(4096, 64, generator=g).to(dtype), torch.randn(4096, 64, generator=g).to(dtype)
    rows, n, ctx = 20000, 16, 1024
    k_buf = torch.randn(3, rows, 64, generator=g).to(dtype)
    v_buf = torch.randn(3, rows, 64, generator=g).to(dtype)
    slots = torch.stack([torch.randperm(rows, generator=g)[:ctx] for _ in range(n)])
    lens = torch.full((n,), ctx, dtype=torch.int64)
    qd = torch.randn(n, 9, 64, generator=g).to(dtype)
    ops_rows = {
        "silu_and_mul [4096, 2x1536]": lambda: ops.silu_and_mul(gate_up),
        "rms_norm [4096, 576]": lambda: ops.rms_norm(x, w, 1e-5),
        "add_rms_norm [4096, 576]": lambda: ops.add_rms_norm(x, res, w, 1e-5),
        "rope [4096, 9, 64]": lambda: ops.rope(q3, cos, sin, 64),
        "decode_attention 16 x 1024": lambda: ops.decode_attention(qd, k_buf, v_buf, slots, lens, 0.125),
    }
    if dtype == torch.bfloat16 and ops.prefill_attention_supported():
        qp = qkv[:, : 9 * 64].view(4096, 9, 64)
        kp = qkv[:, 9 * 64 : 12 * 64].view(4096, 3, 64)
        vp = qkv[:, 12 * 64 :].view(4096, 3, 64)
        ops_rows["prefill_attention 4096 (AMX)"] = lambda: ops.prefill_attention(qp, kp, vp, 0.125)
    return ops_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--build", action="append", required=True, help="an ISA variant name or a kernel .so (repeat)"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    builds = [(b, load(b)) for b in args.build]
    best: dict[tuple[str, str, str], float] = {}
    jobs = {(b, str(d)): workloads(ops, d) for b, ops in builds for d in (torch.float32, torch.bfloat16)}
    total = args.rounds * sum(len(rows) for rows in jobs.values())
    with tqdm(total=total, desc="rounds x ops x builds") as bar:
        for _ in range(args.rounds):
            for (b, d), rows in jobs.items():
                for op, fn in rows.items():
                    ms = fastest_ms(fn, args.iters)
                    key = (d, op, b)
                    best[key] = min(best.get(key, float("inf")), ms)
                    bar.update()
    names = [b for b, _ in builds]
    print(f"\n| dtype | op | {' | '.join(os.path.basename(n) for n in names)} |")
    print("|---|---|" + "---|" * len(names))
    for d in (str(torch.float32), str(torch.bfloat16)):
        ops_seen = dict.fromkeys(op for (dd, op, _) in best if dd == d)
        for op in ops_seen:
            cells = [f"{best[(d, op, n)]:.2f}" if (d, op, n) in best else "-" for n in names]
            print(f"| {d.removeprefix('torch.')} | {op} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
