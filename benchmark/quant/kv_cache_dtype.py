"""Decode ITL with an FP8 KV cache vs the model-dtype cache, in-process schedulers (no HTTP).

Two schedulers over the same model (default: the embedded SmolLM2-135M GGUF, --dtype bfloat16),
one per `--kv-cache-dtype` (default `auto` = bf16, and `fp8_e4m3`), each with `--batch` requests
of `--prompt-len` random tokens prefilled, then decode steps timed round by round, interleaved
(one step of each per round), median ms per step. Also prints each pool's tokens and bytes.

    python benchmark/quant/kv_cache_dtype.py --threads 2 --batch 8 --prompt-len 512

The cpu backend's decode reads an FP8 pool with the fused `decode_attention` kernel (widened in the
kernel); `--op` times that kernel alone instead (the build SGLANG_CPU_ISA selects), SmolLM2-135M's
attention shapes (9 query / 3 KV heads of 64), bf16 q over a bf16, an e4m3 and an e5m2 pool,
`--batch` requests of `--prompt-len` scattered rows; best of `--rounds` rounds, interleaved:

    python benchmark/quant/kv_cache_dtype.py --op --threads 1 --batch 8 --prompt-len 512
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sglang.test.scheduler_harness import SchedulerHarness


def _harness(args, kv_cache_dtype: str) -> SchedulerHarness:
    kwargs = dict(
        dtype=args.dtype,
        num_threads=args.threads,
        kv_cache_dtype=kv_cache_dtype,
        max_total_tokens=args.batch * (args.prompt_len + args.rounds + 8) + 64,
        chunked_prefill_size=args.batch * args.prompt_len,
        max_prefill_tokens=args.batch * args.prompt_len,
        disable_radix_cache=True,
    )
    if args.model_path:
        kwargs["model_path"] = args.model_path
    return SchedulerHarness(**kwargs)


def time_op(args) -> None:
    """decode_attention alone: bf16 q over a bf16 / e4m3 / e5m2 pool (fp8 with scales != 1), with
    the `bf16_dot` flag the `cpu` backend passes on this CPU."""
    from sglang.srt.kernels.cpu import loader
    from sglang.srt.platforms.kernel_dispatch import decode_bf16_dot

    torch.set_num_threads(args.threads)
    ops = loader.load()
    if ops is None:
        raise SystemExit("no CPU kernel build here (see `python -m sglang.srt.kernels.cpu.loader`)")
    hq, hk, hd, b, ctx = 9, 3, 64, args.batch, args.prompt_len
    g = torch.Generator().manual_seed(0)
    rows = b * ctx + 1000  # every request's rows scattered over the pool
    k, v = torch.randn(hk, rows, hd, generator=g), torch.randn(hk, rows, hd, generator=g)
    slots = torch.randperm(rows, generator=g)[: b * ctx].view(b, ctx).contiguous()
    lens = torch.full((b,), ctx, dtype=torch.int64)
    q = torch.randn(b, hq, hd, generator=g).bfloat16()
    pools = {"bf16": (k.bfloat16(), v.bfloat16(), 1.0)}
    pools.update(
        {n: (k.to(d), v.to(d), 0.5) for n, d in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2))}
    )
    dot = decode_bf16_dot(torch.device("cpu"))
    best = {name: float("inf") for name in pools}
    for _ in range(args.rounds):
        for name, (kb, vb, s) in pools.items():
            t0 = time.perf_counter()
            for _ in range(5):
                ops.decode_attention(q, kb, vb, slots, lens, hd**-0.5, s, s, dot)
            best[name] = min(best[name], (time.perf_counter() - t0) / 5 * 1e6)
    for name, us in best.items():
        print(
            f"decode_attention ({ops.isa()} build, bf16_dot {dot}, {args.threads} thread(s)) {b} x {ctx}, {name} pool: "
            f"{us:.1f} us (x{us / best['bf16']:.3f})"
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--rounds", type=int, default=32)
    p.add_argument("--kv", nargs="+", default=["auto", "fp8_e4m3"])
    p.add_argument("--op", action="store_true", help="time the fused decode_attention kernel alone")
    args = p.parse_args()
    if args.op:
        time_op(args)
        return
    torch.manual_seed(0)
    harnesses = {kv: _harness(args, kv) for kv in args.kv}
    vocab = next(iter(harnesses.values())).scheduler.model_config.vocab_size
    prompts = [torch.randint(10, vocab, (args.prompt_len,)).tolist() for _ in range(args.batch)]
    for kv, h in harnesses.items():
        for prompt in prompts:
            h.submit(prompt, args.rounds + 4)
        while len(h.scheduler.running) < args.batch or h.scheduler.waiting:  # prefill everything
            h.step()
            if h.finish:  # refused (e.g. a prompt past the model's context) or finished early
                raise SystemExit(
                    f"--kv-cache-dtype {kv}: a request ended before the decode steps: {h.finish}"
                )
    times: dict[str, list[float]] = {kv: [] for kv in harnesses}
    for _ in range(args.rounds):
        for kv, h in harnesses.items():
            t0 = time.perf_counter()
            h.step()
            times[kv].append((time.perf_counter() - t0) * 1e3)
    base = statistics.median(times[args.kv[0]])
    for kv, h in harnesses.items():
        state = h.scheduler.internal_state()
        med = statistics.median(times[kv])
        pool = f"{state['max_total_num_tokens']} tokens {state['kv_pool_bytes'] / 2**20:.1f} MiB"
        print(
            f"--kv-cache-dtype {kv}: {state['kv_cache_storage_dtype']}, pool {pool}; decode step "
            f"(batch {args.batch}, ~{args.prompt_len} ctx) median {med:.2f} ms (x{med / base:.3f}), "
            f"min {min(times[kv]):.2f} ms"
        )


if __name__ == "__main__":
    main()
