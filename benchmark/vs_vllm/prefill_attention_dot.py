"""`prefill_attention_vec` with its float32 FMA scores vs `bf16_dot=True` (vdpbf16ps scores), A / B.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmark/vs_vllm/prefill_attention_dot.py

One layer's causal prefill attention of a bf16 model (SmolLM2-135M's 9 query / 3 KV heads of 64
unless `--heads` / `--head-dim`), `--tokens` fresh tokens, `--threads` threads, the avx512bf16 build
(the only one with the dot path; elsewhere the flag is ignored and both columns time one path).
Rounds alternate the two forms; ms per call, mean and fastest round; and the largest difference
between the two outputs (bf16: the dot form sums exact products in another order).
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--heads", default="9,3", help="query heads, KV heads")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--build", default="avx512bf16")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sglang.srt.kernels.cpu import loader

    result = loader.load_variant(args.build)
    if result.module is None:
        raise SystemExit(result.reason)
    ops = result.module
    hq, hk = (int(x) for x in args.heads.split(","))
    n, d = args.tokens, args.head_dim
    qkv = torch.randn(n, (hq + 2 * hk) * d, generator=torch.Generator().manual_seed(0)).bfloat16()
    q = qkv[:, : hq * d].view(n, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(n, hk, d)
    v = qkv[:, (hq + hk) * d :].view(n, hk, d)
    scale = d**-0.5
    forms = {"float32 FMA scores": {}, "bf16_dot scores": {"bf16_dot": True}}
    outs = {name: ops.prefill_attention_vec(q, k, v, scale, **kw) for name, kw in forms.items()}
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(args.rounds):
        for name, kw in forms.items():
            t = time.perf_counter()
            for _ in range(args.calls):
                ops.prefill_attention_vec(q, k, v, scale, **kw)
            times[name].append((time.perf_counter() - t) / args.calls * 1e3)
    a, b = outs.values()
    print(f"{n} tokens, {hq} / {hk} heads of {d}, {args.threads} threads, build {ops.isa()}")
    for name, ts in times.items():
        print(f"  {name:20s} mean {sum(ts) / len(ts):7.2f} ms, fastest round {min(ts):7.2f} ms")
    base, dot = (sum(ts) / len(ts) for ts in times.values())
    print(
        f"  ratio (FMA / dot, means) {base / dot:.2f}; largest output difference {(a.float() - b.float()).abs().max():.2e}"
    )


if __name__ == "__main__":
    main()
