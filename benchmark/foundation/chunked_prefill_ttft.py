"""Time to first token of one long prompt through `sgl.Engine`, with chunked prefill.

    .venv/bin/python benchmark/foundation/chunked_prefill_ttft.py \
        --model-path benchmark/vs_vllm/.work/smollm2-hf --input-len 8000 --chunked-prefill-size 2048

Sends `--repeats` prompts of random token ids (a new seed each, radix cache off, so every prompt
is prefilled in full) with `max_new_tokens=1` one after another and prints each latency. Later
chunks attend over the cached prefix of earlier ones, so this exercises the prefix path of the
attention backend. Compare trees by putting the other one's `python/` first on `PYTHONPATH`, or
the torch paths with `SGLANG_CPU_KERNELS=0`.
"""

from __future__ import annotations

import argparse
import random
import time

from tqdm import tqdm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--input-len", type=int, default=8000)
    p.add_argument("--chunked-prefill-size", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    import sglang as sgl

    engine = sgl.Engine(
        model_path=args.model_path,
        dtype=args.dtype,
        chunked_prefill_size=args.chunked_prefill_size,
        disable_radix_cache=True,
        log_level="error",
    )
    try:
        times = []
        for seed in tqdm(range(args.repeats), desc="prompts"):
            rnd = random.Random(seed)
            ids = [rnd.randrange(100, 10000) for _ in range(args.input_len)]
            start = time.perf_counter()
            engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0.0})
            times.append(time.perf_counter() - start)
    finally:
        engine.shutdown()
    print(
        f"input {args.input_len}, chunks of {args.chunked_prefill_size}: TTFT s per prompt",
        [round(t, 2) for t in times],
    )


if __name__ == "__main__":
    main()
