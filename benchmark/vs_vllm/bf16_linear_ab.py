"""bf16 decoder linears of a model's shape over all its layers (each layer's own weights, so they
come from memory as in a decode step): the kernels' `bf16_linear` (AMX tiles and its vdpbf16ps
path) against oneDNN's packed bf16 linear and plain `F.linear`, wall ms per pass over the layers
(best of --rounds), ratios to oneDNN in one run. Picks `BF16_LINEAR_MAX_ROWS`
(platforms/cpu_linears.py). `--lm-head`: the float32-logits LM head instead (SmolLM2's 49152 x 576,
five copies in turn so that it comes from memory): `bf16_linear_f32out` (AMX) against
`linear_f32out_packed` (vector lanes), ms per call.

    python benchmark/vs_vllm/bf16_linear_ab.py --threads 2 --rows 1 4 8 16 32 64 128 256 512 1024
    python benchmark/vs_vllm/bf16_linear_ab.py --threads 2 --lm-head --rows 1 2 4 8 16 32

`--build avx512` / `--build avx2` time that build's path instead of vdpbf16ps (AVX-512 without
BF16 / AVX2: each weight pair widened by a shift and a mask, float32 FMAs), with a float32
`F.linear` column (the float32 weights or copies `--dtype auto` runs there); emulate such a CPU for
oneDNN with `ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI` / `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from sglang.srt.kernels.cpu import loader
from sglang.srt.layers.linear_bf16_packed import pack_bf16_kpairs
from sglang.srt.layers.linear_float32_out import pack_bf16_pairs
from sglang.srt.platforms.cpu_linears import onednn_linear

SMOLLM2 = ["960x576", "576x576", "3072x576", "576x1536"]  # qkv, o_proj, gate_up, down


def best_ms(step, rounds: int) -> float:
    for _ in range(2):
        step()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=SMOLLM2, help="out x in, one layer's linears")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 128, 256, 512])
    p.add_argument(
        "--vec-max-rows", type=int, default=64, help="time the vdpbf16ps path up to this many rows"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--lm-head", action="store_true", help="the float32-logits LM head kernels instead")
    p.add_argument("--build", default="avx512bf16", choices=["avx512bf16", "avx512", "avx2"])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ops = loader.load_variant(args.build).module
    if args.lm_head:
        return lm_head(ops, args)
    pair = onednn_linear()
    if ops is None or ops.bf16_linear_impl() == "" or (pair is None and args.build == "avx512bf16"):
        raise SystemExit(
            f"needs the {args.build} build on a CPU that runs it (avx512bf16: and oneDNN's bf16 linear)"
        )
    pack, onednn = pair or (lambda w: w, None)  # without oneDNN's bf16 (AVX2): plain F.linear first
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    weights = [[torch.randn(n, k).bfloat16() * 0.05 for n, k in shapes] for _ in range(args.layers)]
    onednn_w = [[pack(w) for w in layer] for layer in weights]
    kpairs = [[pack_bf16_kpairs(w) for w in layer] for layer in weights]
    wide = [[w.float() for w in layer] for layer in weights] if args.build != "avx512bf16" else None
    mb = sum(w.numel() * 2 for layer in weights for w in layer) / 2**20
    print(
        f"{args.threads} thread(s), {args.layers} layers x {args.shapes} ({mb:.0f} MiB); bf16_linear path here: {ops.bf16_linear_impl()}"
    )
    extra = " | float32 F.linear" if wide else ""
    first = "oneDNN packed" if onednn is not None else "plain F.linear (no oneDNN bf16)"
    print(f"rows | {first} ms | bf16_linear AMX | bf16_linear vector | plain F.linear{extra}")
    for m in args.rows:
        xs = {k: torch.randn(m, k).bfloat16() for _, k in shapes}
        xf = {k: x.float() for k, x in xs.items()}

        def run(kind: str) -> float:
            def step() -> None:
                for li, layer in enumerate(weights):
                    for j, (n, k) in enumerate(shapes):
                        if kind == "onednn" and onednn is not None:
                            onednn(xs[k], onednn_w[li][j], None)
                        elif kind in ("plain", "onednn"):
                            F.linear(xs[k], layer[j])
                        elif kind == "float32":
                            F.linear(xf[k], wide[li][j])
                        else:
                            ops.bf16_linear(xs[k], kpairs[li][j], n, None, kind == "amx")

            return best_ms(step, args.rounds)

        base = run("onednn")
        cells = [f"{base:.1f}"]
        for kind in ("amx", "vec", "plain") + (("float32",) if wide else ()):
            if kind == "amx" and ops.bf16_linear_impl() != "amx" or kind == "vec" and m > args.vec_max_rows:
                cells.append("-")
                continue
            ms = run(kind)
            cells.append(f"{ms:.1f} ({ms / base:.2f}x)")
        print(f"{m} | " + " | ".join(cells), flush=True)


def lm_head(ops, args: argparse.Namespace, n: int = 49152, k: int = 576, copies: int = 5) -> None:
    if ops is None or ops.bf16_linear_impl() != "amx":
        raise SystemExit("--lm-head needs the avx512bf16 build on an AMX CPU")
    heads = [torch.randn(n, k).bfloat16() * 0.05 for _ in range(copies)]
    lanes = [pack_bf16_pairs(w) for w in heads]
    kpairs = [pack_bf16_kpairs(w) for w in heads]
    print(f"{args.threads} thread(s), LM head {n} x {k}, {copies} copies in turn; ms per call")
    print("rows | linear_f32out_packed | bf16_linear_f32out (AMX)")
    for m in args.rows:
        x = torch.randn(m, k)
        old = best_ms(lambda: [ops.linear_f32out_packed(x, p, n, None) for p in lanes], args.rounds) / copies
        new = best_ms(lambda: [ops.bf16_linear_f32out(x, p, n, None) for p in kpairs], args.rounds) / copies
        print(f"{m} | {old:.2f} | {new:.2f} ({new / old:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
