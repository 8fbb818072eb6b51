"""Whole-model prefill and decode time per dtype mode, in one process (to choose `--dtype auto`).

  ONEDNN_MAX_CPU_ISA=AVX2 SGLANG_CPU_ISA=avx2 .venv/bin/python benchmark/vs_vllm/dtype_modes.py

Modes: bfloat16, float32, and auto with the CPU flags of SGLANG_CPU_FLAGS_OVERRIDE (default: this
CPU's, under the ISA caps above); `--min-tokens` lists thresholds of the mixed mode to try. Each
mode loads the embedded SmolLM2-135M through the in-process scheduler (tests' harness) and times:
one prefill of `--prefill` tokens (1 output token), and `--decode-steps` decode steps at batch 1
and batch 8 (32-token prompts). Prints ms per prefill / per decode step and the load.
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def measure(dtype: str, prefill: int, steps: int, threads: int) -> dict:
    from sglang.srt.model_loader.default_model import find_default_model
    from sglang.test.scheduler_harness import SchedulerHarness

    path = find_default_model()
    h = SchedulerHarness(
        model_path=path, dtype=dtype, max_total_tokens=16384, num_threads=threads, chunked_prefill_size=8192
    )
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(100, 40000, (n,), generator=g).tolist()  # noqa: E731
    h.submit(ids(64), 4)  # warm-up
    h.run()
    out = {}
    best = float("inf")
    for _ in range(2):
        h.submit(ids(prefill), 1)
        t0 = time.perf_counter()
        h.run()
        best = min(best, time.perf_counter() - t0)
    out["prefill_ms"] = best * 1e3
    for batch in (1, 8):
        for _ in range(batch):
            h.submit(ids(32), steps + 1)
        h.step()  # the prefill step of all of them (one chunk)
        n0 = len(h.batch_shapes)
        t0 = time.perf_counter()
        h.run()
        n = len(h.batch_shapes) - n0
        out[f"decode_b{batch}_ms"] = (time.perf_counter() - t0) / max(1, n) * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="bfloat16,float32,auto")
    ap.add_argument(
        "--min-tokens", default="", help="thresholds of auto's mixed mode to try (comma-separated)"
    )
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=24)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    from sglang.srt.platforms import cpu

    runs = []
    for mode in args.modes.split(","):
        if mode == "auto" and args.min_tokens:
            runs += [(mode, int(t)) for t in args.min_tokens.split(",")]
        else:
            runs.append((mode, None))
    print(
        f"torch {torch.__version__}, threads {args.threads}, ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '-')}, "
        f"SGLANG_CPU_ISA={os.environ.get('SGLANG_CPU_ISA', '-')}, auto -> {cpu.CpuPlatform().auto_dtype_choice().mode}"
    )
    from sglang.srt.platforms import fresh_platforms

    for mode, t in runs:
        if t is not None:  # the threshold is read when the platform makes its --dtype auto choice
            cpu.FLOAT32_GEMM_MIN_TOKENS = t
        load = os.getloadavg()[0]
        with fresh_platforms():
            r = measure(mode, args.prefill, args.decode_steps, args.threads)
        label = mode if t is None else f"auto(min {t})"
        print(
            f"{label:>16}: prefill {args.prefill} tok {r['prefill_ms']:8.0f} ms | decode step b1 "
            f"{r['decode_b1_ms']:6.1f} ms, b8 {r['decode_b8_ms']:6.1f} ms | load {load:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
