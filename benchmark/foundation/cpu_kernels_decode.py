"""Per-op times of the fused CPU kernels at decode sizes, per ISA build, next to the torch reference.

    .venv/bin/python benchmark/foundation/cpu_kernels_decode.py                       # every runnable build + torch
    .venv/bin/python benchmark/foundation/cpu_kernels_decode.py --build avx2 --build torch --rounds 5
    .venv/bin/python benchmark/foundation/cpu_kernels_decode.py --build main-avx2=/tmp/old/_C_avx2.cpython-311-x86_64-linux-gnu.so --build avx2

Shapes are SmolLM2-135M's decode step (hidden 576, intermediate 1536, 9 query / 3 KV heads of
64): RMSNorm / add + RMSNorm on [B, 576], SiLU-and-mul on [B, 2 x 1536], RoPE on the query heads
[B, 9, 64] (strided rows of a qkv projection), decode attention of B requests over `ctx` tokens
each in scattered rows of a head-major pool; B = 1 and 8, ctx = 1024 and 4096. A build is an ISA
variant of this tree's install-time build, the path of another tree's kernel module (.so, for a
before / after; `LABEL=PATH.so` names its column) or `torch`:
kernels/cpu/reference.py (the ops' torch code, same signatures). One torch thread unless
`--threads`. Each round times every op on every build; a time is the fastest call over all rounds (for the
ops under 20 µs: the fastest block of calls lasting ~20 µs, per call), in µs: on a shared
machine the minimum is the figure other processes disturb least.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

import torch

HIDDEN, INTER, HQ, HK, HD = 576, 1536, 9, 3, 64


def label(build: str) -> str:
    if build.endswith(".so"):
        return build.partition("=")[0] if "=" in build else os.path.basename(build).split(".")[0]
    return build


def load(build: str):
    if build.endswith(".so"):
        build = build.partition("=")[2] or build
        name = os.path.basename(build).split(".")[0]
        spec = importlib.util.spec_from_file_location(name, build)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    if build == "torch":
        from sglang.srt.kernels.cpu import reference

        return reference
    from sglang.srt.kernels.cpu import loader

    result = loader.load_variant(build)
    if result.module is None:
        raise SystemExit(result.reason)
    return result.module


def fastest_us(fn, iters: int) -> float:
    """Fastest of up to `iters` timed blocks (each of enough calls to last ~20 µs, one call for
    the slow ops; at most ~0.3 s of blocks), per call."""
    fn()
    start = time.perf_counter()
    fn()
    t0 = (time.perf_counter() - start) * 1e6
    calls = max(1, int(20.0 / max(t0, 0.1)))
    blocks = max(3, min(iters, int(3e5 / max(t0 * calls, 1.0))))
    best = float("inf")
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def workloads(ops, dtype: torch.dtype, batches, contexts) -> dict:
    g = torch.Generator().manual_seed(0)
    rows: dict = {}
    for b in batches:
        x = torch.randn(b, HIDDEN, generator=g).to(dtype)
        res = torch.randn(b, HIDDEN, generator=g).to(dtype)
        w = torch.rand(HIDDEN, generator=g).to(dtype)
        gate_up = torch.randn(b, 2 * INTER, generator=g).to(dtype)
        qkv = torch.randn(b, (HQ + 2 * HK) * HD, generator=g).to(dtype)
        q = qkv[:, : HQ * HD].view(b, HQ, HD)
        cos, sin = torch.randn(b, HD, generator=g).to(dtype), torch.randn(b, HD, generator=g).to(dtype)
        rows[f"rms_norm [{b}, {HIDDEN}]"] = lambda x=x, w=w: ops.rms_norm(x, w, 1e-5)
        rows[f"add_rms_norm [{b}, {HIDDEN}]"] = lambda x=x, r=res, w=w: ops.add_rms_norm(x, r, w, 1e-5)
        rows[f"silu_and_mul [{b}, 2x{INTER}]"] = lambda gu=gate_up: ops.silu_and_mul(gu)
        rows[f"rope [{b}, {HQ}, {HD}]"] = lambda q=q, c=cos, s=sin: ops.rope(q, c, s, HD)
        for ctx in contexts:
            pool = b * ctx + 1000  # every request's slots scattered over the pool
            k_buf = torch.randn(HK, pool, HD, generator=g).to(dtype)
            v_buf = torch.randn(HK, pool, HD, generator=g).to(dtype)
            slots = torch.randperm(pool, generator=g)[: b * ctx].view(b, ctx).contiguous()
            lens = torch.full((b,), ctx, dtype=torch.int64)
            rows[f"decode_attention {b} x {ctx}"] = lambda q=q, k=k_buf, v=v_buf, s=slots, n=lens: (
                ops.decode_attention(q, k, v, s, n, HD**-0.5)
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--build",
        action="append",
        help="avx512 / avx2 / generic / torch (repeat); default: all runnable + torch",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=50, help="timed blocks per op and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, action="append", help="default: 1 and 8")
    ap.add_argument("--ctx", type=int, action="append", help="default: 1024 and 4096")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.build is None:
        from sglang.srt.kernels.cpu import isa

        args.build = [v.name for v in isa.runnable_variants()] + ["torch"]
    builds = [(b, load(b)) for b in args.build]
    batches, contexts = args.batch or [1, 8], args.ctx or [1024, 4096]
    jobs = {
        (b, d): workloads(ops, d, batches, contexts)
        for b, ops in builds
        for d in (torch.float32, torch.bfloat16)
    }
    best: dict[tuple, float] = {}
    for r in range(args.rounds):
        for (b, d), rows in jobs.items():
            for op, fn in rows.items():
                key = (str(d).removeprefix("torch."), op, label(b))
                best[key] = min(best.get(key, float("inf")), fastest_us(fn, args.iters))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    names = [label(b) for b, _ in builds]
    ratio = "avx2 / avx512" if {"avx2", "avx512"} <= set(names) else None
    print(f"\n| dtype | op (µs) | {' | '.join(names)} |" + (f" {ratio} |" if ratio else ""))
    print("|---|---|" + "---:|" * (len(names) + bool(ratio)))
    for d in ("float32", "bfloat16"):
        for op in dict.fromkeys(op for (dd, op, _) in best if dd == d):
            cells = [f"{best[(d, op, n)]:.1f}" for n in names]
            extra = f" {best[(d, op, 'avx2')] / best[(d, op, 'avx512')]:.2f} |" if ratio else ""
            print(f"| {d} | {op} | {' | '.join(cells)} |" + extra)


if __name__ == "__main__":
    main()
