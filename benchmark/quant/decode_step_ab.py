"""Decode step time of several models in one process, interleaved: W8A8 with and without an int8
LM head against bf16, each seeing the same memory speed (served single-stream figures on a shared
host move by 20-40 % between runs minutes apart; these move together).

    python benchmark/quant/decode_step_ab.py \\
        bf16=benchmark/vs_vllm/.work/smollm2-hf \\
        w8a8=benchmark/vs_vllm/.work/smollm2-w8a8/compressed-tensors \\
        w8a8-head=benchmark/vs_vllm/.work/smollm2-w8a8-head/compressed-tensors
    python benchmark/quant/decode_step_ab.py bf16=DIR:dummy w8a8=DIR:dummy:w8a8_int8 w8a8-head=DIR2

Each NAME=DIR[:dummy][:w8a8_int8] loads DIR through the in-process scheduler (the tests' harness:
the real runner, packing and float32 logits as served), `--dtype` for every model (W8A8's
activations). Per model: one `--batch`-row batch of `--prompt`-token random prompts is prefilled,
then `--rounds` rounds each time `--steps` decode steps of every model in turn. Prints each model's
median ms per step and its ratio to the first model's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tqdm import tqdm


def load(spec: str, dtype: str, threads: int):
    from sglang.test.scheduler_harness import SchedulerHarness

    name, _, rest = spec.partition("=")
    path, *opts = rest.split(":")
    unknown = set(opts) - {"dummy", "w8a8_int8"}
    if not name or not path or unknown:
        raise ValueError(f"{spec!r}: expected NAME=DIR[:dummy][:w8a8_int8]")
    kwargs = {"load_format": "dummy"} if "dummy" in opts else {}
    if "w8a8_int8" in opts:
        kwargs["quantization"] = "w8a8_int8"
    h = SchedulerHarness(model_path=path, dtype=dtype, max_total_tokens=8192, num_threads=threads, **kwargs)
    return name, h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="NAME=DIR[:dummy][:w8a8_int8]")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = [load(spec, args.dtype, args.threads) for spec in tqdm(args.models, desc="loading")]
    g = torch.Generator().manual_seed(0)
    budget = args.steps * (args.rounds + 1) + 8
    for _, h in models:
        for _ in range(args.batch):
            h.submit(torch.randint(100, 40000, (args.prompt,), generator=g).tolist(), budget)
        h.step()  # the prefill
        for _ in range(args.steps):  # warm-up
            h.step()
    times: dict[str, list[float]] = {name: [] for name, _ in models}
    for _ in tqdm(range(args.rounds), desc="rounds"):
        for name, h in models:
            t = time.perf_counter()
            for _ in range(args.steps):
                h.step()
            times[name].append((time.perf_counter() - t) / args.steps * 1e3)
    base = statistics.median(times[models[0][0]])
    print(f"batch {args.batch}, {args.prompt}-token prompts, --dtype {args.dtype}, {args.threads} threads")
    for name, ts in times.items():
        med = statistics.median(ts)
        spread = f"{min(ts):.2f}-{max(ts):.2f}"
        print(f"  {name}: {med:.2f} ms a step (rounds {spread}), {med / base:.2f}x {models[0][0]}")


if __name__ == "__main__":
    main()
