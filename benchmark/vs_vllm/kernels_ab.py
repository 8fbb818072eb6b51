"""A / B of two builds of the fused CPU kernels at the sizes of `step_breakdown.py`'s workloads.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmark/vs_vllm/kernels_ab.py \\
        --build before=/work/main/python/sglang/srt/kernels/cpu/_C_avx512bf16.cpython-311-x86_64-linux-gnu.so \\
        --build after=avx512bf16

SmolLM2-135M's shapes (hidden 576, intermediate 1536, 9 query / 3 KV heads of 64), bf16: the
prefill ops of one 2048-token prompt (RMSNorm, add + RMSNorm, SiLU-and-mul, RoPE of q and k
together, strided rows as the model passes them) and decode attention of a batch of 8 requests
over 256-320 pool rows each (the decode workload's context and slot layout; 30 layers' pools in
turn, so the KV is read from memory, not cache). A build is an ISA variant
of this tree's install-time build or the path of another tree's kernel module (`LABEL=PATH.so`).
`--threads` torch threads (2: the server's). Rounds alternate the builds, each round of a build in
a process of its own (two builds of one ISA export the same symbols: loaded into one process, the
second would run the first one's code); a figure is the mean per call over all rounds (each round:
`--calls` calls back to back), with the fastest round's mean next to it, in µs, and the ratio
before / after of the first two builds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

import torch

HIDDEN, INTER, HQ, HK, HD = 576, 1536, 9, 3, 64
LAYERS = 30


def load(build: str):
    label, _, path = build.partition("=")
    if not path:
        label, path = build, build
    if path.endswith(".so"):
        name = os.path.basename(path).split(".")[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return label, module
    from sglang.srt.kernels.cpu import loader

    result = loader.load_variant(path)
    if result.module is None:
        raise SystemExit(result.reason)
    return label, result.module


def workloads(ops, tokens: int, batch: int) -> dict:
    g = torch.Generator().manual_seed(0)
    dt = torch.bfloat16
    x = torch.randn(tokens, HIDDEN, generator=g).to(dt)
    res = torch.randn(tokens, HIDDEN, generator=g)  # the float32 residual stream
    w = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).to(dt)
    gate_up = torch.randn(tokens, 2 * INTER, generator=g).to(dt)
    qkv = torch.randn(tokens, (HQ + 2 * HK) * HD, generator=g).to(dt)
    qk = qkv[:, : (HQ + HK) * HD].view(tokens, HQ + HK, HD)
    cos, sin = torch.randn(tokens, HD, generator=g).to(dt), torch.randn(tokens, HD, generator=g).to(dt)
    # the served decode workload's pool: each request's 256 prompt slots one run, then its
    # generated tokens' slots interleaved with the other requests' (one per step); a pool per
    # layer, used in turn, so that the KV comes from memory as in a served step, not from cache
    lens = torch.randint(256, 321, (batch,), generator=g)
    slots = torch.zeros(batch, 320, dtype=torch.int64)
    for i in range(batch):
        slots[i, :256] = torch.arange(i * 256, (i + 1) * 256)
        slots[i, 256:] = batch * 256 + torch.arange(64) * batch + i
    pool = batch * 320 + 1
    kv = [
        (torch.randn(HK, pool, HD, generator=g).to(dt), torch.randn(HK, pool, HD, generator=g).to(dt))
        for _ in range(LAYERS)
    ]
    q = torch.randn(batch, (HQ + 2 * HK) * HD, generator=g).to(dt)[:, : HQ * HD].view(batch, HQ, HD)
    layer = iter(range(10**9))

    def attend():
        k_buf, v_buf = kv[next(layer) % LAYERS]
        return ops.decode_attention(q, k_buf, v_buf, slots, lens, HD**-0.5)

    return {
        f"rms_norm [{tokens}, {HIDDEN}]": lambda: ops.rms_norm(x, w, 1e-5),
        f"add_rms_norm [{tokens}, {HIDDEN}] (float32 residual)": lambda: ops.add_rms_norm(x, res, w, 1e-5),
        f"silu_and_mul [{tokens}, 2x{INTER}]": lambda: ops.silu_and_mul(gate_up),
        f"rope [{tokens}, {HQ + HK}, {HD}]": lambda: ops.rope(qk, cos, sin, HD),
        f"decode_attention {batch} x 256-320 ({LAYERS} layers' pools in turn)": attend,
    }


def worker(build: str, args) -> None:
    """One round of one build in this process: the mean per call of each op, as JSON."""
    torch.set_num_threads(args.threads)
    _, ops = load(build)
    out = {}
    for op, fn in workloads(ops, args.tokens, args.batch).items():
        fn()
        t = time.perf_counter()
        for _ in range(args.calls):
            fn()
        out[op] = (time.perf_counter() - t) / args.calls * 1e6
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--build", action="append", required=True, help="LABEL=PATH.so or an ISA build name (repeat)"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.build[0], args)
    # one process per build and round: two builds of one ISA export the same symbols, so a second
    # one loaded into a process would run the first one's code (symbol interposition)
    labels = [b.partition("=")[0] if "=" in b else b for b in args.build]
    times: dict[tuple[str, str], list[float]] = {}
    ops_order: list[str] = []
    for _ in range(args.rounds):
        for label, build in zip(labels, args.build):
            cmd = [sys.executable, __file__, "--worker", "--build", build, "--threads", str(args.threads)]
            cmd += ["--tokens", str(args.tokens), "--batch", str(args.batch), "--calls", str(args.calls)]
            res = json.loads(
                subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
            )
            for op, t in res.items():
                times.setdefault((op, label), []).append(t)
                if op not in ops_order:
                    ops_order.append(op)
    ratio = len(labels) >= 2
    head = " | ".join(f"{lb} mean (best round)" for lb in labels)
    print(
        f"\n| op (µs per call, {args.threads} threads) | {head} |"
        + (f" {labels[0]} / {labels[1]} |" if ratio else "")
    )
    print("|---|" + "---:|" * (len(labels) + ratio))
    for op in ops_order:
        means = [sum(times[(op, lb)]) / len(times[(op, lb)]) for lb in labels]
        cells = [f"{m:.1f} ({min(times[(op, lb)]):.1f})" for m, lb in zip(means, labels)]
        print(f"| {op} | {' | '.join(cells)} |" + (f" {means[0] / means[1]:.2f} |" if ratio else ""))


if __name__ == "__main__":
    main()
