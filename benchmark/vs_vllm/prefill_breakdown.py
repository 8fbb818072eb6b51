"""Where one long prefill goes: every fused CPU kernel call and every packed GEMM timed in process.

    .venv/bin/python benchmark/vs_vllm/prefill_breakdown.py \
        --model-path benchmark/vs_vllm/.work/smollm2-hf --input-len 4096

Builds a ModelRunner as `sglang.bench_one_batch` does, wraps the kernel module's functions, the
KV-pool write and each layer's packed linear kernel with timers, runs `--repeats` prefills of
random prompts and prints the last one's per-op totals (the timers add a little to the total).
"""

from __future__ import annotations

import argparse
import collections
import random
import time

from tqdm import tqdm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--input-len", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    acc: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()

    def timed(name, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            out = fn(*a, **kw)
            acc[name] += time.perf_counter() - t
            calls[name] += 1
            return out

        return wrapper

    from sglang.srt.kernels.cpu import loader

    chosen = loader.choose()
    module = chosen.module
    if module is not None:

        class Timed:
            def __getattr__(self, name):
                attr = getattr(module, name)
                return timed(name, attr) if callable(attr) and name != "prefill_attention_supported" else attr

        loader._loaded[chosen.variant] = loader.LoadResult(
            chosen.variant, Timed()
        )  # before the model is built: layers look kernels up lazily
    from sglang import bench_one_batch
    from sglang.srt.mem_cache import kv_pool

    kv_pool.MHATokenToKVPool.set_kv_buffer = timed("kv write", kv_pool.MHATokenToKVPool.set_kv_buffer)
    bench_args, server_args = bench_one_batch.parse_args(
        [
            "--model-path",
            args.model_path,
            "--dtype",
            args.dtype,
            "--batch-size",
            "1",
            "--input-len",
            str(args.input_len),
            "--output-len",
            "1",
        ]
    )
    bench = bench_one_batch.RunnerBench(server_args)
    for mod in bench.runner.model.modules():
        packed = getattr(mod, "packed_weight", None)
        if packed is not None:
            kernel = timed(f"linear {type(mod).__name__}", packed[1])
            if getattr(packed[1], "swiglu", None) is not None:  # keep the fused gate (gate_up layers)
                kernel.swiglu = timed(f"linear+gate {type(mod).__name__}", packed[1].swiglu)
            mod.packed_weight = (packed[0], kernel)
    total = 0.0
    for _ in tqdm(range(args.repeats), desc="prefills"):
        acc.clear()
        calls.clear()
        prompt = [random.randint(100, bench.vocab_size - 1) for _ in range(args.input_len)]
        t = time.perf_counter()
        bench.run([prompt], 1)
        total = time.perf_counter() - t
    print(
        f"prefill of {args.input_len} tokens: {total * 1e3:.0f} ms, timed ops {sum(acc.values()) * 1e3:.0f} ms"
    )
    for name, sec in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"  {name:40s} {sec * 1e3:8.1f} ms  ({calls[name]} calls)")


if __name__ == "__main__":
    main()
