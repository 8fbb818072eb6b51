"""Time the fused CPU elementwise kernels (SiLU-and-mul, RMSNorm, add + RMSNorm) of one build.

    .venv/bin/python benchmark/foundation/elementwise_ops.py                  # this tree's build
    .venv/bin/python benchmark/foundation/elementwise_ops.py --isa avx2       # one ISA variant of it
    .venv/bin/python benchmark/foundation/elementwise_ops.py --so OTHER.so    # another build (A/B)

Shapes are SmolLM2-135M's at a 4096-token prefill ([4096, 2 x 1536] for SiLU-and-mul, [4096, 576]
for the norms), float32 and bfloat16; median of `--iters` calls after warm-up, 2 threads unless
`--threads`. For a before/after, build the other tree's kernels (`make setup` there builds them
into its python/sglang/srt/kernels/cpu/_C_*.so) and pass its .so; run the two alternately on an
idle machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

import torch


def load(so_path: str | None, isa: str | None = None):
    if so_path is None:
        from sglang.srt.kernels.cpu import loader

        result = loader.load_variant(isa) if isa else loader.choose()
        if result.module is None:
            raise SystemExit(f"the CPU kernels are not available: {result.reason}")
        return result.module
    name = os.path.basename(so_path).split(".")[0]
    spec = importlib.util.spec_from_file_location(name, so_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def median_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--so", default=None, help="a built kernel module (.so); default: this tree's build")
    ap.add_argument("--isa", default=None, help="an ISA variant of this tree's build (avx512, avx2, generic)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ops = load(args.so, args.isa)
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        gate_up = torch.randn(4096, 2 * 1536, generator=gen).to(dtype)
        x = torch.randn(4096, 576, generator=gen).to(dtype)
        res = torch.randn(4096, 576, generator=gen).to(dtype)
        w = torch.rand(576, generator=gen).to(dtype)
        rows = {
            "silu_and_mul [4096, 2x1536]": lambda: ops.silu_and_mul(gate_up),
            "rms_norm [4096, 576]": lambda: ops.rms_norm(x, w, 1e-5),
            "add_rms_norm [4096, 576]": lambda: ops.add_rms_norm(x, res, w, 1e-5),
        }
        for name, fn in rows.items():
            print(f"{str(dtype).removeprefix('torch.'):9s} {name:30s} {median_ms(fn, args.iters):8.2f} ms")


if __name__ == "__main__":
    main()
