"""Per-rank DSA kernel work at cp 2 vs cp 1, without two ranks competing for the machine.

`run.py` times the indexer and sparse attention inside real cp 2 ranks; on a 2-core box shared
with other jobs those ranks slow each other down (caches, cores), which the per-rank times then
carry. This script runs, in ONE process with one thread, the fused CPU ops on exactly the work one
rank does: the own-query indexer (`DSAKernels.own_query_topk`) and the selected-row attention
(`attend_rows`) of a zigzag rank's two segments of one `--tokens` prompt against the whole
sequence, next to the same ops on all queries (cp 1); random float32 inputs with the benchmark
model's shapes (indexer 16 heads x 64, latent 256 + rope 64, 16 heads, index_topk 2048), one layer.
Thread CPU time, best of `--repeats`.

    python benchmark/dsa/cp_share.py [--tokens 16384 32768] [--repeats 2]
"""

from __future__ import annotations

import argparse
import time

import torch
from tqdm import tqdm

from sglang.srt.layers.attention.dsa.kernels import DSAKernels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[16384, 32768])
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    k = DSAKernels("cpu", "cpu")
    rows = []
    for n in args.tokens:
        g = torch.Generator().manual_seed(n)
        iq, iw, keys = (
            torch.randn(n, 16, 64, generator=g),
            torch.randn(n, 16, generator=g),
            torch.randn(n, 64, generator=g),
        )
        q, seq = torch.randn(n, 16, 320, generator=g), torch.randn(n, 320, generator=g)
        seg = n // 4
        shares = {
            "cp1 (all queries)": torch.arange(n),
            "cp2 rank 0 (segments 0, 3)": torch.cat([torch.arange(0, seg), torch.arange(3 * seg, n)]),
            "cp2 rank 1 (segments 1, 2)": torch.arange(seg, 3 * seg),
        }
        for name, pos in tqdm(shares.items(), desc=f"{n} tokens", unit="share"):
            best_i = best_s = float("inf")
            for _ in range(args.repeats):
                t = time.thread_time()
                sel = k.own_query_topk(iq[pos], iw[pos], pos, keys, args.topk, 0.125)
                ti = time.thread_time() - t
                t = time.thread_time()
                k.attend_rows(q[pos], seq, pos, sel, 0.07, 256)
                ts = time.thread_time() - t
                best_i, best_s = min(best_i, ti), min(best_s, ts)
            rows.append((n, name, best_i, best_s))
    print("\n| tokens | share | indexer CPU (s) | sparse attention CPU (s) |\n|---|---|---:|---:|")
    for n, name, ti, ts in rows:
        print(f"| {n} | {name} | {ti:.2f} | {ts:.2f} |")
    print()
    for n in args.tokens:
        r = {name: (ti, ts) for m, name, ti, ts in rows if m == n}
        c1 = r["cp1 (all queries)"]
        worst = [max(v[i] for key, v in r.items() if key.startswith("cp2")) for i in (0, 1)]
        print(
            f"- {n}: cp1 / slowest cp2 rank: indexer {c1[0] / worst[0]:.2f}x, sparse attention {c1[1] / worst[1]:.2f}x"
        )


if __name__ == "__main__":
    main()
