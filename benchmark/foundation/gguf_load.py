"""Opening and dequantizing a GGUF file: our reader (`model_loader/gguf_file.py`) and torch block
dequantization (`model_loader/gguf_dequant.py`) against the `gguf` package's `GGUFReader` and
`gguf.quants.dequantize`, same file, interleaved rounds, median seconds, one torch thread.

    python benchmark/foundation/gguf_load.py [--path FILE.gguf] [--rounds 3]

Default file: the embedded SmolLM2-135M Q4_1 GGUF (49,152-token vocab; Q4_1 / Q8_0 / F32 tensors).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from sglang.srt.model_loader.gguf_dequant import dequantize_gguf
from sglang.srt.model_loader.gguf_file import read_gguf


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.path is None:
        from sglang.srt.model_loader.default_model import find_default_model

        args.path = find_default_model()
    torch.set_num_threads(1)
    tensors = read_gguf(args.path).tensors
    cases = {
        "open: GGUFReader": lambda: GGUFReader(args.path, "r"),
        "open: gguf_file.read_gguf": lambda: read_gguf(args.path),
        "dequantize all: gguf.quants": lambda: [
            np.asarray(dequantize(t.data, t.tensor_type)) for t in tensors
        ],
        "dequantize all: gguf_dequant": lambda: [dequantize_gguf(t.data, t.tensor_type) for t in tensors],
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            times[name].append(_timed(fn))
    print(f"{args.path}, {len(tensors)} tensors, median of {args.rounds} rounds, 1 thread")
    for name, ts in times.items():
        print(f"  {name:32s} {statistics.median(ts):8.3f} s  (min {min(ts):.3f}, max {max(ts):.3f})")


if __name__ == "__main__":
    main()
