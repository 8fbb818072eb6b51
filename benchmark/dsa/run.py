"""DeepSeek Sparse Attention (V3.2) on CPU: the `dsa` backend (sgl_kernel_npu's fused ops) vs dense MLA,
prefill and decode, and the indexer / sparse attention split under context parallelism (cp 1 vs 2).

A dummy (random-weight) DeepSeek-V3.2 sized for a small machine: 2 layers, hidden 1024, 16 heads,
q-LoRA 384, kv-LoRA 256 + rope 64 (320-value latent rows), indexer 16 heads x 64, index_topk 2048,
float32 (dense MLP layers: MoE does not change the attention picture), model only (no scheduler),
one torch thread per rank. "Dense MLA" is the same model with index_topk >= the context (the
indexer only stores its keys; attention is dense, torch's flash kernel), on the `cpu` backend.

Runs, per `--tokens` value (default 16384 and 32768):
1. prefill of one prompt: dense MLA (cpu backend), DSA on the `dsa` backend at cp 1 and cp 2
   (zigzag), and with `--reference` also DSA on the reference path (the `cpu` backend's torch ops);
2. per rank: Lightning Indexer time (scoring + top-k) and sparse attention time.
And one decode step of `--decode-batch` requests at `--decode-context` tokens each (default 4 x
32768), DSA vs dense: the KV / index-key pool is filled with random rows instead of a prefill
(a decode step's cost does not depend on where the rows came from).

`--bf16-index` adds DSA cp 1 runs (prefill and decode) whose indexer scores in bf16
(SGLANG_DSA_INDEX_SCORE_DTYPE=bfloat16: query and index keys rounded to bf16, float32 sums).
`--int8-index` adds DSA cp 1 and cp 2 prefill runs and a decode run whose indexer scores in int8
(SGLANG_DSA_INDEX_SCORE_DTYPE=int8: per-row int8 query heads and keys, exact integer dots; the pool
keeps an int8 copy of the index keys).
`--fp8-kv` adds a DSA cp 1 prefill and a decode run over an FP8 pool (`--kv-cache-dtype fp8_e4m3`:
latent rows and index keys in 1 byte, widened in sgl_kernel_npu's kernels).

Prints markdown tables. `--quick` is a smoke version (1K tokens, index_topk 128, 1 layer).

    python benchmark/dsa/run.py [--tokens 16384 32768] [--decode-context 32768 --decode-batch 4] [--reference]
        [--bf16-index] [--int8-index] [--fp8-kv]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections import defaultdict
from typing import Any

from report import print_decode, print_prefill, print_table  # this directory's
from tqdm import tqdm

SHAPE: dict[str, Any] = dict(
    vocab_size=1024,
    hidden_size=1024,
    intermediate_size=2048,
    moe_intermediate_size=256,
    num_hidden_layers=2,
    first_k_dense_replace=2,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    num_attention_heads=16,
    num_key_value_heads=16,
    q_lora_rank=384,
    kv_lora_rank=256,
    qk_nope_head_dim=64,
    qk_rope_head_dim=64,
    v_head_dim=64,
    index_n_heads=16,
    index_head_dim=64,
    max_position_embeddings=40960,
    bos_token_id=1,
    eos_token_id=2,
)
QUICK = dict(num_hidden_layers=1)

# (module, attribute[, class]) timed per rank: the indexer's selection and the selected-token attention
TIMED = {
    "indexer": [
        ("sglang.srt.layers.attention.dsa.indexer", "index_topk_positions", None),
        ("sglang.srt.layers.attention.mla_cp", "own_query_topk", None),
        ("sglang.srt.layers.attention.dsa.kernels", "select_paged", "DSAKernels"),
        ("sglang.srt.layers.attention.dsa.kernels", "own_query_topk", "DSAKernels"),
        ("sglang.srt.layers.attention.dsa.kernels", "shard_topk_candidates", "DSAKernels"),
    ],
    "sparse": [
        ("sglang.srt.layers.attention.latent_attention", "sparse_latent_attention", None),
        ("sglang.srt.layers.attention.mla_cp", "sparse_latent_attention", None),
        ("sglang.srt.layers.attention.dsa.kernels", "attend_paged", "DSAKernels"),
        ("sglang.srt.layers.attention.dsa.kernels", "attend_rows", "DSAKernels"),
        ("sglang.srt.layers.attention.dsa.kernels", "attend_slots", "DSAKernels"),
    ],
}


def _instrument(totals: dict[str, float]) -> None:
    """Wrap the timed functions (looked up at call time) with timers."""
    import importlib

    for kind, targets in TIMED.items():
        for module_name, attr, cls_name in targets:
            owner = importlib.import_module(module_name)
            if cls_name:
                owner = getattr(owner, cls_name)
            fn = getattr(owner, attr)

            def timed(*args, __fn=fn, __kind=kind, **kwargs):
                start, cpu = time.perf_counter(), time.thread_time()
                try:
                    return __fn(*args, **kwargs)
                finally:
                    totals[__kind] += time.perf_counter() - start
                    totals[__kind + "_cpu"] += time.thread_time() - cpu

            setattr(owner, attr, timed)


def _backend_env(backend: str):
    """(backend, KV pool dtype): 'dsa-bf16' / 'dsa-int8' = the dsa backend with bf16 / int8 index
    scoring (set in this rank's environment), 'dsa-fp8kv' = the dsa backend over an FP8 e4m3 pool."""
    import os

    import torch

    if backend == "dsa-fp8kv":
        return "dsa", torch.float8_e4m3fn
    scoring = {"dsa-bf16": "bfloat16", "dsa-int8": "int8"}.get(backend)
    if scoring is not None:
        os.environ["SGLANG_DSA_INDEX_SCORE_DTYPE"] = scoring
        return "dsa", None
    return backend, None


def _setup(rank: int, cp: int, port: int, shape: dict, topk: int, mode: str = "cp"):
    """This rank's groups and dummy model; `cp` ranks in all, split by context (`mode` "cp"), by
    tensor parallelism only ("tp") or into pipeline stages ("pp", one layer range per rank;
    benchmark/context_parallel/bench_cp_vs_tp.py)."""
    import torch

    torch.set_num_threads(1)
    from transformers import DeepseekV32Config

    from sglang.srt.distributed.init import init_distributed
    from sglang.srt.distributed.parallel_layout import ParallelLayout
    from sglang.srt.distributed.parallel_state import ParallelGroups
    from sglang.srt.model_loader.dummy_loader import init_dummy_weights
    from sglang.srt.models.deepseek_v2 import DeepseekV32ForCausalLM

    if cp > 1:
        init_distributed(cp, rank, f"127.0.0.1:{port}", "gloo")
        layouts = {"cp": dict(tp=cp, attn_cp=cp), "tp": dict(tp=cp), "pp": dict(pp=cp)}
        if mode not in layouts:
            raise ValueError(f"mode {mode!r}: expected one of {sorted(layouts)}")
        layout = ParallelLayout(**layouts[mode])
        groups = ParallelGroups.build(layout, rank)
    else:
        groups = ParallelGroups.single()
    cfg = DeepseekV32Config(index_topk=topk, **shape)
    cfg.architectures = ["DeepseekV32ForCausalLM"]
    model = DeepseekV32ForCausalLM(cfg, groups, torch.float32).eval()
    init_dummy_weights(model, seed=0)
    return cfg, groups, model


def _harness(
    cfg, groups, model, backend: str, tokens: int, requests: int = 2, kv_dtype=None, context: int = 0
):
    """A harness whose pool holds `tokens` (+256) tokens, for `requests` requests of up to `context`
    tokens each (`tokens` when 0)."""
    import torch

    from sglang.test.cp_forward_helpers import CPForwardHarness

    h = CPForwardHarness(
        cfg,
        groups.attn_cp,
        "zigzag",
        max_total_tokens=tokens + 256,
        max_requests=requests + 1,
        max_context_len=(context or tokens) + 256,
        attention_backend=backend,
    )
    h.token_to_kv_pool = model.create_kv_pool(
        h.mapping.physical_pool_size(h.allocator.size), 1, torch.float32, "cpu", kv_dtype
    )
    return h


def _prefill_rank(rank, cp, port, shape, topk, tokens, repeats, backend, out) -> None:
    import torch

    backend, kv_dtype = _backend_env(backend)
    cfg, groups, model = _setup(rank, cp, port, shape, topk)
    totals: dict[str, float] = defaultdict(float)
    _instrument(totals)
    ids = torch.randint(3, cfg.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    indexers = [m.indexer for m in model.modules() if getattr(m, "indexer", None) is not None]
    runs = []
    for i in range(repeats + 1):  # the first, short prefill is a warm-up
        h = _harness(cfg, groups, model, backend, tokens, kv_dtype=kv_dtype)
        totals.clear()
        for idx in indexers:
            idx.reset_counters()
        groups.attn_cp.barrier()
        start, cpu = time.perf_counter(), time.thread_time()
        h.forward(model, [(h.new_request(), ids if i else ids[:512])])
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
        groups.attn_cp.barrier()
        if i:
            runs.append(
                {
                    "time": elapsed,
                    "cpu": cpu,
                    "indexer": totals["indexer"],
                    "sparse": totals["sparse"],
                    "indexer_cpu": totals["indexer_cpu"],
                    "sparse_cpu": totals["sparse_cpu"],
                    "rows": sum(x.score_rows for x in indexers),
                }
            )
    out.put((rank, min(runs, key=lambda r: r["time"])))


def decode_pool(cfg, groups, model, backend: str, context: int, batch: int, steps: int, kv_dtype=None):
    """(harness, requests): `batch` requests holding `context` tokens each, with room for `steps`
    decode steps (a step rolled back keeps its slot: up to a page of cp slots each); the pool rows (latent, index keys) are random instead of a prefill (a decode
    step's cost does not depend on where the rows came from)."""
    import torch

    h = _harness(
        cfg,
        groups,
        model,
        backend,
        batch * (context + 2 * steps + 8),
        batch,
        kv_dtype,
        context + 2 * steps + 8,
    )
    reqs = [h.new_request() for _ in range(batch)]
    h.build_batch([(r, [5] * context) for r in reqs])  # allocates the slots, runs nothing
    gen = torch.Generator().manual_seed(1)
    pool = h.token_to_kv_pool
    block = 1 << 16  # rows per random block: no pool-sized temporary
    for layer in range(model.start_layer, model.end_layer):
        kv = pool.get_key_buffer(layer)
        for a in range(0, kv.shape[0], block):
            kv[a : a + block].copy_(torch.randn(kv[a : a + block].shape, generator=gen))
        if getattr(pool, "index_k_fp8", False):  # codes and their scales, as written
            for a in range(0, kv.shape[0], block):
                rows = torch.arange(a, min(a + block, kv.shape[0]))
                pool.set_index_k_buffer(
                    layer, rows, torch.randn(rows.numel(), pool.index_head_dim, generator=gen)
                )
        elif hasattr(pool, "get_index_k_buffer"):
            ik = pool.get_index_k_buffer(layer)
            for a in range(0, ik.shape[0], block):
                ik[a : a + block].copy_(torch.randn(ik[a : a + block].shape, generator=gen))
    return h, reqs


def _decode_rank(rank, cp, port, shape, topk, context, batch, repeats, backend, out) -> None:
    """One decode step of `batch` requests at `context` tokens (pool rows random, no prefill)."""
    backend, kv_dtype = _backend_env(backend)
    cfg, groups, model = _setup(rank, cp, port, shape, topk)
    totals: dict[str, float] = defaultdict(float)
    _instrument(totals)
    h, reqs = decode_pool(cfg, groups, model, backend, context, batch, repeats + 1, kv_dtype)
    runs = []
    for i in range(repeats + 1):
        totals.clear()
        batch_items = [(r, [7]) for r in reqs]
        start, cpu = time.perf_counter(), time.thread_time()
        h.forward(model, batch_items)
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
        for r in reqs:  # roll the step back so every repeat runs at the same context
            r.tokens.pop()
        if i:
            runs.append(
                {
                    "time": elapsed,
                    "cpu": cpu,
                    "indexer": totals["indexer"],
                    "sparse": totals["sparse"],
                    "indexer_cpu": totals["indexer_cpu"],
                    "sparse_cpu": totals["sparse_cpu"],
                    "rows": 0,
                }
            )
    out.put((rank, min(runs, key=lambda r: r["time"])))


def spawn(target, cp: int, *args) -> list[dict]:
    from sglang.srt.distributed.init import get_free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = get_free_port()
    procs = [ctx.Process(target=target, args=(r, cp, port, *args, out)) for r in range(cp)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=7200) for _ in procs)
    for p in procs:
        p.join()
    return [r for _, r in results]


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[16384, 32768])
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--decode-context", type=int, default=32768)
    ap.add_argument("--decode-batch", type=int, default=4)
    ap.add_argument("--decode-repeats", type=int, default=3)
    ap.add_argument("--reference", action="store_true", help="also DSA on the reference path (slow)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1K tokens, index_topk 128, 1 layer")
    ap.add_argument("--bf16-index", action="store_true", help="also DSA cp 1 with bf16 index scoring")
    ap.add_argument(
        "--int8-index", action="store_true", help="also DSA cp 1 and cp 2 with int8 index scoring"
    )
    ap.add_argument("--fp8-kv", action="store_true", help="also DSA cp 1 over an FP8 e4m3 KV pool")
    return ap.parse_args()


def _plan(args, token_list: list[int], topk: int, dctx: int) -> list[tuple]:
    """(name, rank body, cp, index_topk, tokens, backend) of every run the flags ask for."""
    dense_k = 1 << 30
    plan = []
    for n in token_list:
        plan += [
            (f"{n} dense MLA cp1", _prefill_rank, 1, dense_k, n, "cpu"),
            (f"{n} DSA cp1", _prefill_rank, 1, topk, n, "dsa"),
            (f"{n} DSA cp2", _prefill_rank, 2, topk, n, "dsa"),
        ]
        if args.reference:
            plan.append((f"{n} DSA reference cp1", _prefill_rank, 1, topk, n, "cpu"))
        if args.bf16_index:
            plan.append((f"{n} DSA bf16-index cp1", _prefill_rank, 1, topk, n, "dsa-bf16"))
        if args.fp8_kv:
            plan.append((f"{n} DSA fp8-kv cp1", _prefill_rank, 1, topk, n, "dsa-fp8kv"))
        if args.int8_index:
            plan += [
                (f"{n} DSA int8-index cp1", _prefill_rank, 1, topk, n, "dsa-int8"),
                (f"{n} DSA int8-index cp2", _prefill_rank, 2, topk, n, "dsa-int8"),
            ]
    if args.decode_batch > 0:
        plan += [
            ("decode dense MLA", _decode_rank, 1, dense_k, dctx, "cpu"),
            ("decode DSA", _decode_rank, 1, topk, dctx, "dsa"),
        ]
        if args.bf16_index:
            plan.append(("decode DSA bf16-index", _decode_rank, 1, topk, dctx, "dsa-bf16"))
        if args.int8_index:
            plan.append(("decode DSA int8-index", _decode_rank, 1, topk, dctx, "dsa-int8"))
        if args.fp8_kv:
            plan.append(("decode DSA fp8-kv", _decode_rank, 1, topk, dctx, "dsa-fp8kv"))
    return plan


def main() -> None:
    args = _args()
    shape = dict(SHAPE)
    token_list, topk, dctx = args.tokens, args.topk, args.decode_context
    if args.quick:
        shape.update(QUICK)
        token_list, topk, dctx = [1024], 128, 1024
    results: dict[str, list[dict]] = {}
    for name, target, cp, k, n, backend in tqdm(
        _plan(args, token_list, topk, dctx), desc="dsa benchmark", unit="run"
    ):
        if target is _prefill_rank:
            results[name] = spawn(target, cp, shape, k, n, args.repeats, backend)
        else:
            results[name] = spawn(target, cp, shape, k, n, args.decode_batch, args.decode_repeats, backend)
        print(f"  {name}: " + ", ".join(f"{r['time']:.3f} s" for r in results[name]), flush=True)
    print_table(results, shape["num_hidden_layers"], topk)
    for n in token_list:
        print_prefill(results, n)
    if args.decode_batch > 0:
        print_decode(results, args.decode_batch, dctx)


if __name__ == "__main__":
    main()
