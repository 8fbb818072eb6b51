"""The fused CPU Lightning Indexer kernel alone: float32 vs bf16 vs int8 scoring, per instruction-set build.

One request of `--context` keys whose last `--queries` tokens are the queries (causal, the shapes of
the benchmark model: 16 index heads x 64, one thread), index_topk 16 (almost no top-k work: the
scoring rate) and 2048 (scoring + the streaming top-k). Rows: float32 scoring on a float32 key
cache; bf16 scoring (`score_dtype=torch.bfloat16`: inputs rounded to bf16, float32 sums) on a
float32 cache (rounded in the kernel) and on a bf16 cache; on the avx512bf16 build both ways of
multiplying the bf16 pairs (`fma`: float32 FMAs on the rounded values, the default; `dpbf16`:
vdpbf16ps); int8 scoring (`score_dtype=torch.int8`: per-row int8 query heads and keys, integer
dots: vpdpbusd on avx512bf16 / avx512vnni / avx2vnni, vpmaddwd on avx512 / avx2) on a float32 cache (quantized in the call)
and on an int8 cache (int8 rows + per-row scales, quantized beforehand). Thread CPU time, best of
`--repeats`; GFLOP/s counts 2 x heads x dim per (query, key) (int8: integer multiply-adds); `load`
is the 1-minute load average when the row was timed.

`fma_vs_dpbf16.cpp` (next to this file) measures the two instructions' multiply-add rates alone:

    g++ -O2 -o /tmp/fma_vs_dpbf16 benchmark/dsa/fma_vs_dpbf16.cpp && /tmp/fma_vs_dpbf16

    python benchmark/dsa/indexer_kernel.py [--context 8192 32768] [--queries 256 64] [--isas avx512bf16 avx512vnni avx512 avx2vnni avx2]
        [--decode 4]   # + a decode step's indexer: 4 requests of the largest context, one query each
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import sgl_kernel_npu as skn
from sgl_kernel_npu import cpu
from sgl_kernel_npu.reference import quantize_int8

INT8_DOT = {
    "avx512bf16": "vpdpbusd",
    "avx512vnni": "vpdpbusd",
    "avx512": "vpmaddwd",
    "avx2vnni": "vpdpbusd ymm",
    "avx2": "vpmaddwd",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, nargs="*", default=[8192, 32768])
    ap.add_argument("--queries", type=int, nargs="*", default=[256, 64], help="one per --context value")
    ap.add_argument("--isas", nargs="*", default=None, help="default: every build this CPU runs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode", type=int, default=4, help="decode table: this many requests (0: none)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    isas = args.isas or cpu.supported_isas()
    print("| context | queries | build | multiply | scoring | key cache | top-k | ms | GFLOP/s | load |")
    print("|---|---:|---|---|---|---|---:|---:|---:|---:|")
    for n, q0 in zip(args.context, args.queries):
        g = torch.Generator().manual_seed(0)
        q, w = torch.randn(q0, 16, 64, generator=g), torch.randn(q0, 16, generator=g)
        keys = torch.randn(1, n, 1, 64, generator=g)
        k8, k_scale = quantize_int8(keys)
        kw = dict(
            actual_seq_lengths_query=torch.tensor([q0]),
            actual_seq_lengths_key=torch.tensor([n]),
            block_table=torch.zeros(1, 1, dtype=torch.int32),
            layout_query="TND",
            layout_key="PA_BSND",
            sparse_mode=3,
            impl="cpu",
        )
        flop = 2 * 16 * 64 * sum(n - q0 + i + 1 for i in range(q0))
        rows = [("float32", "float32", keys, None, {})]  # (scoring, cache, keys, score_dtype, extra kwargs)
        rows += [
            ("bf16", "float32", keys, torch.bfloat16, {}),
            ("bf16", "bf16", keys.bfloat16(), torch.bfloat16, {}),
        ]
        rows += [
            ("int8", "float32", keys, torch.int8, {}),
            ("int8", "int8", k8, torch.int8, {"key_scale": k_scale}),
        ]
        for isa in isas:
            for dot in ["fma", "dpbf16"] if isa == "avx512bf16" else ["fma"]:
                for label, cache, kk, sd, extra in rows:
                    if sd != torch.bfloat16 and dot != "fma":
                        continue
                    for topk in (16, 2048):
                        with cpu.force_isa(isa), cpu.bf16_dot(dot):
                            best = _best(
                                args.repeats,
                                lambda: skn.lightning_indexer(
                                    q, kk, w, sparse_count=topk, score_dtype=sd, **kw, **extra
                                ),
                            )
                        mult = {torch.bfloat16: dot, torch.int8: INT8_DOT.get(isa, "int32")}.get(sd, "—")
                        print(
                            f"| {n} | {q0} | {isa} | {mult} | {label} | {cache} | {topk} | {best * 1e3:.1f} | "
                            f"{flop / best / 1e9:.1f} | {os.getloadavg()[0]:.2f} |",
                            flush=True,
                        )
    if args.decode:
        decode(args.decode, max(args.context), isas, args.repeats)


def _best(repeats: int, fn) -> float:
    """Thread CPU seconds of fn(), best of `repeats`."""
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best


def decode(batch: int, n: int, isas: list[str], repeats: int) -> None:
    """A decode step's indexer: `batch` requests of n keys (pages of 64 rows), one query each, top-k
    2048: every key is read (and with int8 scoring on a float32 cache, quantized) for one query."""
    g = torch.Generator().manual_seed(1)
    q, w = torch.randn(batch, 16, 64, generator=g), torch.randn(batch, 16, generator=g)
    keys = torch.randn(batch * n // 64, 64, 1, 64, generator=g)
    k8, k_scale = quantize_int8(keys)
    kw = dict(
        actual_seq_lengths_query=torch.arange(1, batch + 1),
        actual_seq_lengths_key=torch.full((batch,), n),
        block_table=torch.arange(batch * n // 64, dtype=torch.int32).view(batch, n // 64),
        layout_query="TND",
        layout_key="PA_BSND",
        sparse_mode=3,
        sparse_count=2048,
        impl="cpu",
    )
    rows = [
        ("float32", "float32", keys, None, {}),
        ("int8", "float32", keys, torch.int8, {}),
        ("int8", "int8", k8, torch.int8, {"key_scale": k_scale}),
    ]
    print(
        f"\n| decode: requests x keys | build | scoring | key cache | ms | load |\n|---|---|---|---|---:|---:|"
    )
    for isa in isas:
        for label, cache, kk, sd, extra in rows:
            with cpu.force_isa(isa):
                best = _best(repeats, lambda: skn.lightning_indexer(q, kk, w, score_dtype=sd, **kw, **extra))
            print(
                f"| {batch} x {n} | {isa} | {label} | {cache} | {best * 1e3:.2f} | {os.getloadavg()[0]:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
