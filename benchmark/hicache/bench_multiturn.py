"""HiCache: a multi-turn chat workload whose KV is several times the KV pool (issue 31, measure c).

`--conversations` conversations of `--turns` turns each; a turn's prompt is the conversation's
history (every earlier prompt and answer) plus `--user-tokens` new tokens, and its answer
`--answer-tokens` greedy tokens. `--concurrency` workers take the turns round-robin over the
conversations (turn 1 of every conversation, then turn 2, ...; a conversation's next turn waits
for its previous answer), so between two turns of one conversation every other conversation runs
and, without HiCache, pushes its history out of the KV pool: the next turn recomputes it. The KV
pool (`--max-total-tokens`) is the workload's final KV divided by `--pool-fraction` (4).

Servers, one after another, same arguments but the cache flags:
- radix cache only;
- HiCache, a host tier (L2) large enough for the whole workload;
- the same + the `file` storage tier (L3) in a temporary directory;
- HiCache with a host tier of 1.5x the pool + `file` L3 (most reuse then comes from L3).

A dummy (random-weight) Llama with SmolLM2-135M's shape, one torch thread (the shape and config as
`bench_hicache_ttft.py`). Per server: wall time, requests/s, prompt tokens/s, TTFT P50 / P90
(first streamed chunk), prompt tokens computed and the prefix tokens served per tier (scheduler
counters). Prints a markdown table with the ratios to the radix-only server.

    python benchmark/hicache/bench_multiturn.py [--quick] [--conversations 16 --turns 4 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "context_parallel"))
from bench_cp_prefill import SMOLLM2_SHAPE, write_config  # noqa: E402

COUNTERS = (
    "prefill_tokens_computed",
    "hicache_l1_hit_tokens",
    "hicache_l2_hit_tokens",
    "hicache_l3_hit_tokens",
    "hicache_backup_seconds",
    "hicache_storage_write_seconds",
    "hicache_load_seconds",
)


@dataclass
class Workload:
    conversations: int
    turns: int
    user_tokens: int
    answer_tokens: int
    concurrency: int
    pool_fraction: float

    @property
    def final_history(self) -> int:
        return self.turns * (self.user_tokens + self.answer_tokens)

    @property
    def total_kv(self) -> int:
        return self.conversations * self.final_history

    @property
    def pool_tokens(self) -> int:
        return int(self.total_kv / self.pool_fraction)

    def user_message(self, conv: int, turn: int) -> list[int]:
        import torch

        gen = torch.Generator().manual_seed(1000 * conv + turn)
        return torch.randint(3, SMOLLM2_SHAPE["vocab_size"], (self.user_tokens,), generator=gen).tolist()


@dataclass
class Result:
    wall_s: float = 0.0
    ttft: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    requests: int = 0
    counters: dict = field(default_factory=dict)


def engine(path: str, wl: Workload, dtype: str, **extra):
    import sglang as sgl

    return sgl.Engine(
        model_path=f"dummy:{path}",
        load_format="dummy",
        dtype=dtype,
        num_threads=1,
        chunked_prefill_size=-1,
        max_prefill_tokens=wl.final_history + 64,
        context_length=max(4096, 2 * wl.final_history),
        max_total_tokens=wl.pool_tokens,
        max_running_requests=wl.concurrency,
        skip_tokenizer_init=True,
        log_level="warning",
        **extra,
    )


def counters(llm) -> dict:
    state = llm.get_server_info()["internal_states"][0]
    return {k: state.get(k, 0) for k in COUNTERS}


async def one_turn(llm, prompt: list[int], wl: Workload) -> tuple[float, list[int]]:
    """(TTFT, answer ids) of one streamed request."""
    params = {"max_new_tokens": wl.answer_tokens, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    ttft, out = None, []
    async for chunk in await llm.async_generate(input_ids=prompt, sampling_params=params, stream=True):
        if ttft is None:
            ttft = time.perf_counter() - start
        out = chunk["output_ids"]
    return ttft, list(out)


async def drive(llm, wl: Workload, bar: tqdm) -> Result:
    """All turns of all conversations, `concurrency` at a time, round-robin over conversations."""
    res = Result()
    history: list[list[int]] = [[] for _ in range(wl.conversations)]
    done = [asyncio.Event() for _ in range(wl.conversations)]  # the conversation's last turn finished
    for ev in done:
        ev.set()
    queue: asyncio.Queue = asyncio.Queue()
    for turn in range(wl.turns):
        for conv in range(wl.conversations):
            queue.put_nowait((conv, turn))

    async def worker() -> None:
        while not queue.empty():
            conv, turn = queue.get_nowait()
            await done[conv].wait()
            done[conv].clear()
            prompt = history[conv] + wl.user_message(conv, turn)
            ttft, answer = await one_turn(llm, prompt, wl)
            history[conv] = prompt + answer
            res.ttft.append(ttft)
            res.prompt_tokens += len(prompt)
            res.requests += 1
            done[conv].set()
            bar.update(1)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(wl.concurrency)))
    res.wall_s = time.perf_counter() - start
    return res


def run_server(name: str, path: str, wl: Workload, dtype: str, **extra) -> Result:
    with engine(path, wl, dtype, **extra) as llm:
        llm.generate(input_ids=[5] * 32, sampling_params={"max_new_tokens": 2, "temperature": 0})  # warm up
        before = counters(llm)
        with tqdm(total=wl.conversations * wl.turns, desc=name, unit="turn") as bar:
            res = asyncio.run(drive(llm, wl, bar))
        after = counters(llm)
    res.counters = {k: after[k] - before[k] for k in COUNTERS}
    return res


def servers(root: str, wl: Workload, big_ratio: float) -> dict[str, dict]:
    """Name -> the server's cache flags (everything else equal)."""

    def l3(sub: str) -> dict:
        return dict(
            hicache_storage_backend="file",
            hicache_storage_backend_extra_config=json.dumps({"file_path": os.path.join(root, sub)}),
        )

    hi = dict(enable_hierarchical_cache=True)
    return {
        "radix only": {},
        "HiCache L2": dict(hi, hicache_ratio=big_ratio),
        "HiCache L2 + L3 file": dict(hi, hicache_ratio=big_ratio, **l3("l3a")),
        "HiCache small L2 + L3 file": dict(hi, hicache_ratio=1.5, **l3("l3b")),
    }


def table(results: dict[str, Result], wl: Workload) -> str:
    base = results["radix only"]
    base_tput = base.requests / base.wall_s
    base_p50 = statistics.median(base.ttft)
    lines = [
        "| server | wall s | req/s | prompt tok/s | TTFT P50 s | TTFT P90 s | throughput / radix | "
        "TTFT P50 / radix | computed | L1 hit | L2 hit | L3 hit | load s | backup s (L3 write s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        tput, p50 = r.requests / r.wall_s, statistics.median(r.ttft)
        p90 = statistics.quantiles(r.ttft, n=10)[-1] if len(r.ttft) > 1 else p50
        c = r.counters
        lines.append(
            f"| {name} | {r.wall_s:.1f} | {tput:.2f} | {r.prompt_tokens / r.wall_s:.0f} | {p50:.3f} | "
            f"{p90:.3f} | **{tput / base_tput:.2f}x** | **{p50 / base_p50:.2f}x** | "
            f"{c['prefill_tokens_computed']} | {c['hicache_l1_hit_tokens']} | {c['hicache_l2_hit_tokens']} | "
            f"{c['hicache_l3_hit_tokens']} | {c['hicache_load_seconds']:.2f} | "
            f"{c['hicache_backup_seconds']:.2f} ({c['hicache_storage_write_seconds']:.2f}) |"
        )
    return "\n".join(lines)


def parse() -> tuple[argparse.Namespace, Workload]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--user-tokens", type=int, default=512, help="new tokens per turn")
    ap.add_argument("--answer-tokens", type=int, default=16, help="greedy tokens per answer")
    ap.add_argument("--concurrency", type=int, default=2, help="turns in flight")
    ap.add_argument("--pool-fraction", type=float, default=4.0, help="workload KV / KV pool")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--only", nargs="*", help="run only these servers (by name); the first must be 'radix only'"
    )
    ap.add_argument("--quick", action="store_true", help="a small workload (a smoke run, not a figure)")
    args = ap.parse_args()
    if args.quick:
        args.conversations, args.turns, args.user_tokens, args.answer_tokens = 10, 3, 128, 8
    wl = Workload(
        args.conversations,
        args.turns,
        args.user_tokens,
        args.answer_tokens,
        args.concurrency,
        args.pool_fraction,
    )
    if wl.concurrency * wl.final_history > wl.pool_tokens:
        ap.error(
            f"--concurrency {wl.concurrency} x a final history of {wl.final_history} tokens exceeds the pool"
        )
    return args, wl


def main() -> None:
    args, wl = parse()
    with tempfile.TemporaryDirectory() as root:
        path = write_config(root)
        big_ratio = max(2.0, 1.25 * wl.pool_fraction)  # the host tier holds the whole workload
        chosen = servers(root, wl, big_ratio)
        if args.only:
            chosen = {k: v for k, v in chosen.items() if k in ["radix only", *args.only]}
        results = {name: run_server(name, path, wl, args.dtype, **flags) for name, flags in chosen.items()}
    print(
        f"\n{wl.conversations} conversations x {wl.turns} turns, +{wl.user_tokens} user / {wl.answer_tokens} answer "
        f"tokens per turn, concurrency {wl.concurrency}; workload KV {wl.total_kv} tokens, KV pool "
        f"{wl.pool_tokens} ({wl.pool_fraction:g}x smaller); SmolLM2 shape, {args.dtype}, 1 thread\n"
    )
    print(table(results, wl))


if __name__ == "__main__":
    main()
