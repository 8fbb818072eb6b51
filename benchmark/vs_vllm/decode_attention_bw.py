"""How fast the fused `decode_attention` reads its KV pool, against a plain read of the same bytes.

SmolLM2's attention shape (9 query heads, 3 KV heads of 64) at a batch of --batch requests with
--contexts keys each, one bf16 pool per layer (--layers of them in turn, so that the KV comes from
memory as in a decode step): ms per pass over the layers (best of --rounds) and the GB/s that
makes of the K and V bytes read; `torch.sum` over the same bytes as the reference read. Slots in
order (a request's KV mostly contiguous, as a prompt's), or a random permutation (--scattered);
the float32 path (K / V widened) and the `bf16_dot` one (q.k and p.v by vdpbf16ps: AMD's AVX512-BF16
default) in one run.

    python benchmark/vs_vllm/decode_attention_bw.py --threads 2 --contexts 300 1100 [--scattered]
"""

from __future__ import annotations

import argparse
import torch

from bf16_linear_ab import best_ms

from sglang.srt.kernels.cpu import loader


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--contexts", type=int, nargs="+", default=[300, 1100])
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--scattered", action="store_true", help="slots in a random order")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ops = loader.choose().module
    if ops is None:
        raise SystemExit("needs the fused CPU kernels")
    b, hk, d = args.batch, args.kv_heads, args.head_dim
    print(
        f"kernel build {ops.isa()}, {args.threads} thread(s), batch {b}, {args.heads} / {hk} heads of {d}, bf16 pool"
    )
    print("context | decode_attention ms | GB/s | bf16_dot ms | GB/s | torch.sum of the same bytes ms | GB/s")
    for ctx in args.contexts:
        rows = b * ctx + 16
        pools = [
            (torch.randn(hk, rows, d).bfloat16(), torch.randn(hk, rows, d).bfloat16())
            for _ in range(args.layers)
        ]
        order = torch.randperm(rows)[: b * ctx] if args.scattered else torch.arange(b * ctx)
        slots = order.view(b, ctx).contiguous().long()
        lens = torch.full((b,), ctx, dtype=torch.long)
        q = torch.randn(b, args.heads, d).bfloat16()
        nbytes = args.layers * b * ctx * hk * d * 2 * 2  # K and V, bf16

        def attend(dot: bool) -> None:
            for k, v in pools:
                ops.decode_attention(q, k, v, slots, lens, d**-0.5, 1.0, 1.0, dot)

        flat = [torch.cat([k.flatten(), v.flatten()]) for k, v in pools]  # pool rows past the batch's too

        def read() -> None:
            for f in flat:
                f.sum()

        ta, td = (best_ms(lambda dot=dot: attend(dot), args.rounds) / 1e3 for dot in (False, True))
        tr = best_ms(read, args.rounds) / 1e3
        read_bytes = sum(f.numel() * 2 for f in flat)
        cells = [f"{t * 1e3:.2f} | {nbytes / t / 1e9:.1f}" for t in (ta, td)]
        print(f"{ctx} | {cells[0]} | {cells[1]} | {tr * 1e3:.2f} | {read_bytes / tr / 1e9:.1f}", flush=True)


if __name__ == "__main__":
    main()
