"""The summary `benchmark/dsa/run.py` prints: every run's per-rank row, then the prefill and decode
ratios."""

from __future__ import annotations


def print_table(results: dict, layers: int, topk: int) -> None:
    """Every run's per-rank row."""
    print(
        f"\nDeepSeek-V3.2 dummy ({layers} layers, 16 heads, latent 256+64, indexer 16x64), index_topk {topk}, "
        f"float32, 1 torch thread per rank\n"
    )
    print(
        "| run | rank | time (s) | thread CPU (s) | indexer (s) | indexer CPU (s) | sparse attention (s) "
        "| sparse CPU (s) | score rows |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, ranks in results.items():
        for r, x in enumerate(ranks):
            print(
                f"| {name} | {r} | {x['time']:.3f} | {x['cpu']:.3f} | {x['indexer']:.3f} | {x['indexer_cpu']:.3f} | "
                f"{x['sparse']:.3f} | {x['sparse_cpu']:.3f} | {x['rows']} |"
            )
    print()


def print_prefill(results: dict, n: int) -> None:
    """The summary lines of the prefill runs of `n` tokens."""
    dense, dsa, cp2 = (
        results[f"{n} dense MLA cp1"][0],
        results[f"{n} DSA cp1"][0],
        results[f"{n} DSA cp2"],
    )
    print(
        f"- {n}: DSA / dense MLA prefill time = {dsa['time']:.2f} / {dense['time']:.2f} s = "
        f"{dsa['time'] / dense['time']:.2f}x (thread CPU {dsa['cpu'] / dense['cpu']:.2f}x)"
    )
    if f"{n} DSA bf16-index cp1" in results:
        b = results[f"{n} DSA bf16-index cp1"][0]
        print(
            f"- {n}: DSA bf16-index / dense MLA thread CPU = {b['cpu'] / dense['cpu']:.2f}x "
            f"(indexer CPU {b['indexer_cpu']:.2f} s vs float32 {dsa['indexer_cpu']:.2f} s)"
        )
    runs = [("", dsa, cp2)]
    if f"{n} DSA int8-index cp1" in results:
        i1, i2 = results[f"{n} DSA int8-index cp1"][0], results[f"{n} DSA int8-index cp2"]
        print(
            f"- {n}: DSA int8-index / dense MLA prefill time = {i1['time'] / dense['time']:.3f}x "
            f"(thread CPU {i1['cpu'] / dense['cpu']:.3f}x; indexer CPU {i1['indexer_cpu']:.2f} s vs float32 "
            f"{dsa['indexer_cpu']:.2f} s)"
        )
        runs.append((" (int8-index)", i1, i2))
    for tag, one, two in runs:
        for key, label in (("indexer", "indexer"), ("sparse", "sparse attention")):
            worst = max(r[key] for r in two)
            mean = sum(r[key] for r in two) / len(two)
            cworst = max(r[key + "_cpu"] for r in two)
            print(
                f"- {n}{tag}: {label} per rank cp1 / cp2: {one[key]:.2f} s / "
                f"[{', '.join(f'{r[key]:.2f}' for r in two)}] s = {one[key] / worst:.2f}x (slowest rank), "
                f"{one[key] / mean:.2f}x (mean); thread CPU {one[key + '_cpu'] / cworst:.2f}x (slowest rank)"
            )


def print_decode(results: dict, batch: int, dctx: int) -> None:
    """The decode runs' summary lines."""
    dd, ds = results["decode dense MLA"][0], results["decode DSA"][0]
    print(
        f"- decode step, batch {batch} at {dctx}: DSA / dense = {ds['time'] * 1e3:.1f} / "
        f"{dd['time'] * 1e3:.1f} ms = {ds['time'] / dd['time']:.2f}x (thread CPU {ds['cpu'] / dd['cpu']:.2f}x; DSA indexer {ds['indexer'] * 1e3:.1f} ms, "
        f"sparse attention {ds['sparse'] * 1e3:.1f} ms)"
    )
    if "decode DSA int8-index" in results:
        di = results["decode DSA int8-index"][0]
        print(
            f"- decode step, int8-index: DSA / dense = {di['time'] * 1e3:.1f} / {dd['time'] * 1e3:.1f} ms = "
            f"{di['time'] / dd['time']:.2f}x (DSA indexer {di['indexer'] * 1e3:.1f} ms)"
        )
    if "decode DSA fp8-kv" in results:
        df = results["decode DSA fp8-kv"][0]
        print(
            f"- decode step, FP8 / float32 KV pool (DSA): {df['time'] * 1e3:.1f} / {ds['time'] * 1e3:.1f} ms"
            f" = {df['time'] / ds['time']:.2f}x (indexer {df['indexer'] * 1e3:.1f} ms, sparse {df['sparse'] * 1e3:.1f} ms)"
        )
