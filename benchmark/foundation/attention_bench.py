"""Attention-only benchmark of an attention backend (no model weights needed).

    .venv/bin/python benchmark/foundation/attention_bench.py --threads 1 [--backend cpu] [--profile]

The backend defaults to the CPU platform's (`cpu`: the fused-kernel backend the engine serves with);
`--backend torch_native` times the reference.

Builds the real KV pool / allocator / req_to_token for SmolLM2-135M's attention shape (30 layers,
9 query heads, 3 KV heads, head_dim 64, bf16), lays slots out the way the scheduler does (batched
prefill, then interleaved decode steps) and times one forward step of the backend over all
layers: `init_forward_metadata` + 30 x `forward`. Prints the best of several rounds and, with
--profile, the top operators by self CPU time per step.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch

from sglang.srt.layers.attention.radix_attention import RadixAttention
from sglang.srt.layers.attention.registry import create_attention_backend, default_attention_backend
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.req_to_token import ReqToTokenPool
from sglang.srt.model_executor.forward_batch import ForwardBatch, ForwardMode

LAYERS, HQ, HK, D = 30, 9, 3, 64


class _World:
    """Pools + backend; `step` allocates slots for [(row, new tokens)] like the scheduler."""

    def __init__(self, tokens: int, reqs: int, ctx: int, page: int, dtype: torch.dtype, backend: str):
        self.r2t = ReqToTokenPool(reqs, ctx)
        self.pool = MHATokenToKVPool(tokens, page, dtype, HK, D, LAYERS)
        for b in (*self.pool.k_buffer, *self.pool.v_buffer):  # views; works for any layout
            b.normal_()
        self.alloc = TokenToKVPoolAllocator(tokens, page)
        self.backend = create_attention_backend(backend)
        self.lens: dict[int, int] = {}

    def step(self, items: list[tuple[int, int]]) -> ForwardBatch:
        prefix = [self.lens.get(r, 0) for r, _ in items]
        ext = [n for _, n in items]
        last = [int(self.r2t.req_to_token[r, p - 1]) if p else 0 for (r, _), p in zip(items, prefix)]
        decode = all(n == 1 for n in ext) and all(prefix)
        if decode:
            slots = self.alloc.alloc_decode([p + 1 for p in prefix], last)
        else:
            slots = self.alloc.alloc_extend(prefix, ext, last)
        if slots is None:
            raise RuntimeError("KV pool too small")
        c = 0
        for (r, n), p in zip(items, prefix):
            self.r2t.req_to_token[r, p : p + n] = slots[c : c + n]
            self.lens[r] = p + n
            c += n
        seq = [p + n for p, n in zip(prefix, ext)]
        i64 = dict(dtype=torch.int64)
        return ForwardBatch(
            ForwardMode.DECODE if decode else ForwardMode.EXTEND,
            len(items),
            torch.zeros(sum(ext), **i64),
            torch.cat([torch.arange(p, p + n) for p, n in zip(prefix, ext)]),
            slots,
            torch.tensor([r for r, _ in items], **i64),
            torch.tensor(seq, **i64),
            torch.tensor(prefix, **i64),
            torch.tensor(ext, **i64),
            seq,
            prefix,
            ext,
            self.r2t,
            self.pool,
            self.backend,
        )


def _decode(
    batch: int, prompt: int, steps: int, page: int, dtype: torch.dtype, backend: str
) -> tuple[_World, ForwardBatch]:
    w = _World(batch * (prompt + steps + page + 1) + 256, batch, prompt + steps + 8, page, dtype, backend)
    fb = w.step([(r, prompt) for r in range(batch)])
    for _ in range(steps):
        fb = w.step([(r, 1) for r in range(batch)])
    return w, fb


def _extend(
    prefix: int, chunk: int, page: int, dtype: torch.dtype, backend: str
) -> tuple[_World, ForwardBatch]:
    w = _World(prefix + chunk + 256, 1, prefix + chunk + 8, page, dtype, backend)
    w.step([(0, prefix)])
    return w, w.step([(0, chunk)])


SCENARIOS: dict[str, Callable[[int, torch.dtype, str], tuple[_World, ForwardBatch]]] = {
    "decode 1 x 4096": lambda page, dt, be: _decode(1, 4064, 31, page, dt, be),
    "decode 16 x 300": lambda page, dt, be: _decode(16, 256, 43, page, dt, be),
    "decode 4 x 4096": lambda page, dt, be: _decode(4, 4064, 31, page, dt, be),
    "extend 512 over 3584": lambda page, dt, be: _extend(3584, 512, page, dt, be),
}


def _step_fn(w: _World, fb: ForwardBatch) -> Callable[[], None]:
    layers = [RadixAttention(HQ, D, D**-0.5, HK, i) for i in range(LAYERS)]
    n, dt = fb.num_tokens, w.pool.dtype
    q, k, v = (
        torch.randn(n, HQ * D, dtype=dt),
        torch.randn(n, HK * D, dtype=dt),
        torch.randn(n, HK * D, dtype=dt),
    )

    def step() -> None:
        fb.attn_metadata = None
        w.backend.init_forward_metadata(fb)
        for layer in layers:
            w.backend.forward(q, k, v, layer, fb, save_kv_cache=False)

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--only", default=None, help="run the scenarios whose name contains this")
    p.add_argument("--backend", default=None, help="attention backend (default: the CPU platform's)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    backend = args.backend or default_attention_backend("cpu")
    for name, build in SCENARIOS.items():
        if args.only and args.only not in name:
            continue
        torch.manual_seed(0)
        w, fb = build(args.page_size, torch.bfloat16, backend)
        step = _step_fn(w, fb)
        iters = 2 if name.startswith("extend") else 10
        with torch.inference_mode():
            step()
            best = float("inf")
            for _ in range(args.rounds):
                t = time.perf_counter()
                for _ in range(iters):
                    step()
                best = min(best, (time.perf_counter() - t) / iters)
            line = f"{name:22s} {best * 1e3:8.1f} ms/step (30 layers)"
            if args.profile:
                with torch.profiler.profile() as prof:
                    for _ in range(iters):
                        step()
                top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:3]
                line += " | top self-CPU ms/step: " + ", ".join(
                    f"{e.key.replace('aten::', '')} {e.self_cpu_time_total / iters / 1e3:.1f}" for e in top
                )
        print(line, flush=True)


if __name__ == "__main__":
    main()
