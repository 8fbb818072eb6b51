"""HiCache: time to first token of a long shared prefix loaded from the host tier (L2) or the
storage tier (L3: `file`, or `mooncake` with `--storage mooncake`) vs recomputed (issue 31).

A dummy (random-weight) Llama with SmolLM2-135M's shape (`benchmark/context_parallel/`), one
torch thread; engines run one after another, each on a KV pool a little larger than the prefix.
Timed request: the prefix plus `--suffix` new tokens, max_new_tokens=1 (its wall time is the TTFT):

- recompute: radix cache only; the prefix is evicted (flush) before each timed request;
- L2: HiCache, no storage; a filler prompt as long as the prefix pushes the prefix out of the KV
  pool into the host tier (`--hicache-ratio 2` keeps both there), then the prefix is reused;
- L3: HiCache + `file`, `--hicache-ratio 1.1`: the filler pushes the prefix out of the host tier
  too, so it is read back from the directory;
- L3 after restart: a fresh engine on the same directory (empty KV pool and host tier).

`--storage mooncake`: L3 is a Mooncake store instead: a `mooncake_master` on a free local port
and a store client in this process lending the memory (the engines lend none), as in
test/hicache/mooncake_helpers.py; "after restart" is then a fresh engine on the same store.

Each timed request checks the tier it hit from the scheduler's counters. Prints the TTFTs and the
ratios recompute / tier.

    python benchmark/hicache/bench_hicache_ttft.py [--tokens 8192] [--repeats 3] [--storage mooncake]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "context_parallel"))
from bench_cp_prefill import SMOLLM2_SHAPE, kv_bytes_per_rank, write_config  # noqa: E402

TEST_HICACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "test", "hicache")

GREEDY = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}


def token_ids(n: int, seed: int) -> list[int]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, SMOLLM2_SHAPE["vocab_size"], (n,), generator=gen).tolist()


def engine(path: str, tokens: int, dtype: str, **extra):
    import sglang as sgl

    return sgl.Engine(
        model_path=f"dummy:{path}",
        load_format="dummy",
        dtype=dtype,
        num_threads=1,
        chunked_prefill_size=-1,
        max_prefill_tokens=2 * tokens + 64,
        context_length=32768,
        max_total_tokens=tokens + tokens // 4 + 256,
        skip_tokenizer_init=True,
        log_level="warning",
        **extra,
    )


def counters(llm) -> dict:
    return llm.get_server_info()["internal_states"][0]


def timed(llm, ids: list[int], tier_key: str, want: int) -> float:
    """TTFT of `ids`; asserts the scheduler counted at least `want` prefix tokens from `tier_key`."""
    before = counters(llm).get(tier_key, 0)
    start = time.perf_counter()
    llm.generate(input_ids=ids, sampling_params=GREEDY)
    ttft = time.perf_counter() - start
    got = counters(llm).get(tier_key, 0) - before
    assert got >= want, f"{tier_key}: {got} tokens < {want} (the prefix did not come from that tier)"
    return ttft


def run_recompute(path: str, prefix: list[int], suffixes: list[list[int]], dtype: str) -> list[float]:
    with engine(path, len(prefix), dtype) as llm:
        llm.generate(input_ids=prefix[:64], sampling_params=GREEDY)  # warm up
        out = []
        for s in suffixes:
            assert llm.flush_cache().success
            out.append(timed(llm, prefix + s, "prefill_tokens_computed", len(prefix)))
        return out


def storage_args(kind: str, where: str) -> dict:
    """The engine's L3 flags: `where` is the `file` directory or the mooncake master's address."""
    if kind == "file":
        extra = {"file_path": where}
    else:
        extra = {"master_server_address": where, "local_hostname": "127.0.0.1", "global_segment_size": 0}
    return dict(hicache_storage_backend=kind, hicache_storage_backend_extra_config=json.dumps(extra))


@contextlib.contextmanager
def l3_store(kind: str, root: str, stored_tokens: int):
    """Where L3 lives for the run: a directory, or a master and a store service (stopped after)
    lending room for `stored_tokens` of float32 KV."""
    if kind == "file":
        yield os.path.join(root, "kv")
        return
    sys.path.insert(0, TEST_HICACHE)
    from pathlib import Path

    from mooncake_helpers import MooncakeMaster

    master = MooncakeMaster(Path(root))
    service = master.store_service(segment=max(64 << 20, kv_bytes_per_rank(stored_tokens, 1, 1, 4)))
    try:
        yield master.address
    finally:
        service.close()
        master.kill()


def run_tier(path, prefix, suffixes, fillers, dtype, tier: str, storage=None, **extra) -> list[float]:
    """Warm the prefix, then per repeat: a filler evicts it, the prefix + a suffix is timed."""
    storage = storage or {}
    with engine(path, len(prefix), dtype, enable_hierarchical_cache=True, **storage, **extra) as llm:
        llm.generate(input_ids=prefix + [7], sampling_params=GREEDY)
        out = []
        for s, filler in zip(suffixes, fillers):
            llm.generate(input_ids=filler, sampling_params=GREEDY)
            out.append(timed(llm, prefix + s, f"hicache_{tier}_hit_tokens", len(prefix) * 3 // 4))
        return out


def run_restart(path, prefix, suffixes, dtype, storage: dict) -> list[float]:
    out = []
    for s in suffixes:  # a fresh engine each time: nothing in L1 or L2
        with engine(path, len(prefix), dtype, enable_hierarchical_cache=True, **storage) as llm:
            llm.generate(input_ids=[5] * 64, sampling_params=GREEDY)  # warm up (not the prefix)
            out.append(timed(llm, prefix + s, "hicache_l3_hit_tokens", len(prefix) * 3 // 4))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192, help="prefix length")
    ap.add_argument("--suffix", type=int, default=32, help="new tokens after the prefix")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--storage", choices=["file", "mooncake"], default="file", help="the L3 backend")
    args = ap.parse_args()
    prefix = token_ids(args.tokens, 0)
    suffixes = [token_ids(args.suffix, 100 + r) for r in range(args.repeats)]
    fillers = [token_ids(args.tokens, 200 + r) for r in range(args.repeats)]
    with (
        tempfile.TemporaryDirectory() as root,
        l3_store(args.storage, root, (args.repeats + 2) * args.tokens) as where,
    ):
        path = write_config(root)
        l3 = storage_args(args.storage, where)
        results = {
            "recompute": run_recompute(path, prefix, suffixes, args.dtype),
            "L2 (host)": run_tier(path, prefix, suffixes, fillers, args.dtype, "l2", hicache_ratio=2.0),
            f"L3 ({args.storage})": run_tier(
                path, prefix, suffixes, fillers, args.dtype, "l3", storage=l3, hicache_ratio=1.1
            ),
            "L3 after restart": run_restart(path, prefix, suffixes, args.dtype, l3),
        }
    base = statistics.median(results["recompute"])
    print(f"prefix {args.tokens} tokens + {args.suffix} new, SmolLM2 shape, {args.dtype}, 1 thread")
    print(f"{'path':<18} {'TTFT median (s)':>16} {'runs (s)':>28} {'recompute / path':>17}")
    for name, times in results.items():
        med = statistics.median(times)
        runs = " ".join(f"{t:.3f}" for t in times)
        print(f"{name:<18} {med:>16.3f} {runs:>28} {base / med:>16.1f}x")


if __name__ == "__main__":
    main()
