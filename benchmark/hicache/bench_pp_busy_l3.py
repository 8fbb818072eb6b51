"""HiCache at pp 2 on a busy ring: what an L3 prefix load costs the requests already decoding, and
its own TTFT (issue 31: the storage read of a pipeline, stage 0's query and the later stages' reads).

Two pp 2 engines one after the other, HiCache with the `file` storage tier on one directory, a
dummy Llama with SmolLM2-135M's shape, one torch thread per stage:

- writer: prefills `--tokens` prefix tokens once; both stages write their layers' pages to L3;
- served: a fresh engine on the same directory. `--streams` requests (64-token prompts) decode
  `--decode` tokens each, streamed; once every stream has `--warmup` tokens, the L3 request
  (prefix + `--suffix` new tokens, one output token) arrives. Its TTFT, and for the decoding
  streams: the median gap between tokens before it arrived, the longest gap while it loaded (from
  its arrival to its first token, plus 0.25 s), and their tokens per second (all streams) over the
  0.5 s before it and over that window.

    python benchmark/hicache/bench_pp_busy_l3.py [--tokens 8192] [--streams 4] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "context_parallel"))
from bench_cp_prefill import write_config  # noqa: E402
from bench_pp_l3_trace import pp2_engine, token_ids  # noqa: E402

TAIL_S = 0.25  # seconds after the L3 request's first token still counted in its window
BEFORE_S = 0.5  # the streams' tokens per second before it: over this many seconds


def engine(path: str, l3_dir: str, args):
    return pp2_engine(path, l3_dir, args, args.tokens + args.suffix + args.streams * (64 + args.decode) + 256)


async def stream(llm, prompt: list[int], new: int, times: list[float]) -> None:
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    seen = 0
    async for chunk in await llm.async_generate(input_ids=prompt, sampling_params=params, stream=True):
        n = len(chunk["output_ids"])
        now = time.perf_counter()
        times.extend([now] * (n - seen))
        seen = n


async def served(llm, prefix: list[int], args) -> dict:
    times = [[] for _ in range(args.streams)]
    tasks = [
        asyncio.create_task(stream(llm, token_ids(64, 10 + i), args.decode, times[i]))
        for i in range(args.streams)
    ]
    while min(len(t) for t in times) < args.warmup:
        await asyncio.sleep(0.005)
    t_sent = time.perf_counter()
    one = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}
    out = await llm.async_generate(input_ids=prefix + token_ids(args.suffix, 99), sampling_params=one)
    t_first = time.perf_counter()
    await asyncio.gather(*tasks)
    before = [b - a for t in times for a, b in zip(t, t[1:]) if b < t_sent]
    end = t_first + TAIL_S
    during = [b - a for t in times for a, b in zip(t, t[1:]) if b >= t_sent and a <= end]
    tokens = sum(1 for t in times for x in t if t_sent <= x <= end)
    return {
        "ttft": t_first - t_sent,
        "cached": out["meta_info"]["cached_tokens"],
        "gap_median_ms": 1e3 * statistics.median(before),
        "gap_max_ms": 1e3 * max(during),
        "tok_s": tokens / (end - t_sent),
        "tok_s_before": sum(1 for t in times for x in t if t_sent - BEFORE_S <= x < t_sent) / BEFORE_S,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=8192, help="prefix length (on L3)")
    ap.add_argument("--suffix", type=int, default=32, help="new tokens after the prefix")
    ap.add_argument("--streams", type=int, default=4, help="requests decoding when it arrives")
    ap.add_argument("--decode", type=int, default=300, help="tokens each stream decodes")
    ap.add_argument("--warmup", type=int, default=40, help="tokens every stream has before it arrives")
    ap.add_argument("--chunk", type=int, default=1024, help="--chunked-prefill-size")
    ap.add_argument("--repeats", type=int, default=2, help="served engines (one writer)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--quick", action="store_true", help="a 1024-token prefix (a smoke run, not a figure)")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.decode, args.warmup, args.repeats = 1024, 80, 10, 1
    prefix = token_ids(args.tokens, 0)
    with tempfile.TemporaryDirectory() as root:
        path, l3 = write_config(root), os.path.join(root, "l3")
        with engine(path, l3, args) as llm:
            llm.generate(input_ids=prefix, sampling_params={"max_new_tokens": 1, "temperature": 0})
        runs = []
        for _ in range(args.repeats):
            with engine(path, l3, args) as llm:
                runs.append(asyncio.run(served(llm, prefix, args)))
    print(
        f"\npp 2, {args.streams} streams decoding, then a {args.tokens}-token prefix on L3 (file) + "
        f"{args.suffix} new tokens; SmolLM2 shape, {args.dtype}, 1 thread per stage\n"
    )
    print(
        "| run | L3 request TTFT s | cached | stream gap median ms | longest gap while loading ms | "
        "stream tok/s before | while loading |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(runs):
        print(
            f"| {i} | {r['ttft']:.3f} | {r['cached']} | {r['gap_median_ms']:.1f} | {r['gap_max_ms']:.1f} | "
            f"{r['tok_s_before']:.1f} | {r['tok_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
