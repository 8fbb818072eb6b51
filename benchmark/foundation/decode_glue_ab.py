"""The work around a decode step's kernels, before / after, in one process (ratios in one run):

kv store   a layer's scattered K / V writes (`MHATokenToKVPool.set_kv_buffer`) through the
           kernels' fused `kv_store` / the torch path (reshapes, casts, views, two index_copy_),
           SmolLM2's 3 KV heads of 64, bf16, 1 and 8 tokens: us per layer;
moe loop   --moe-layers bf16 `FusedMoE` layers (16 experts of 768, hidden 2,048, top 8) packed for
           the platform's linear, at one token: the layers' forward / their kernel calls alone
           (swiglu + down per routed expert), ms (the gap is the expert loop's own work).

  python benchmark/foundation/decode_glue_ab.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from sglang.srt.layers.linear_prepack import prepack_linear_weights
from sglang.srt.layers.moe.experts import FusedMoE
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.platforms import get_platform
from sglang.srt.platforms.kernel_dispatch import kv_store_op


def median_s(fn, rounds: int, calls: int = 1) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def kv_store_rows(rounds: int) -> None:
    op = kv_store_op(torch.device("cpu"))
    print("tokens | fused kv_store us / layer | torch path us / layer")
    for n in (1, 8):
        loc = torch.randperm(19_000)[:n] + 1
        k, v = torch.randn(n, 192).bfloat16(), torch.randn(n, 192).bfloat16()
        cells = []
        for store in (op, None):
            pool = MHATokenToKVPool(20_000, 1, torch.bfloat16, 3, 64, 30, store_rows=store)
            cells.append(median_s(lambda: pool.set_kv_buffer(3, loc, k, v), rounds, 1000) * 1e6)
        print(f"{n} | {cells[0]:.1f} | {cells[1]:.1f}")


def moe_loop(layers: int, rounds: int) -> None:
    moes = []
    for _ in range(layers):
        moe = FusedMoE(16, 2048, 768, None, None, torch.bfloat16)
        moe.w13_weight.data.normal_(0, 0.02)
        moe.w2_weight.data.normal_(0, 0.02)
        moes.append(moe)
    prepack_linear_weights(nn.ModuleList(moes), get_platform("cpu"))
    x = torch.randn(1, 2048).bfloat16()
    ids, weights = torch.randperm(16)[:8][None], torch.rand(1, 8)

    def forward() -> None:
        for moe in moes:
            moe(x, weights, ids)

    def kernels() -> None:
        for moe in moes:
            packed, kernel = moe.packed_experts
            for e in ids[0].tolist():
                kernel(kernel.swiglu(x, packed[e][0], None), packed[e][1], None)

    f, k = median_s(forward, rounds) * 1e3, median_s(kernels, rounds) * 1e3
    print(f"moe loop, {layers} layers at one token: forward {f:.2f} ms, kernel calls alone {k:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--moe-layers", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if kv_store_op(torch.device("cpu")) is None:
        raise SystemExit("no CPU kernel build here: nothing to compare")
    kv_store_rows(args.rounds)
    if get_platform("cpu").prepacked_linear(torch.bfloat16, torch.device("cpu")) is not None:
        moe_loop(args.moe_layers, args.rounds)


if __name__ == "__main__":
    main()
