"""DeepSeek Sparse Attention (V3.2) prefill on CPU: DSA vs dense MLA, and the indexer / sparse
attention split under context parallelism (cp 1 vs cp 2).

A dummy (random-weight) DeepSeek-V3.2 sized for a small machine: 2 layers, hidden 1024, 16 heads,
q-LoRA 384, kv-LoRA 256 + rope 64 (320-value latent rows), indexer 16 heads x 64, index_topk 2048,
32K context, float32 (dense MLP layers: MoE does not change the attention picture). One prompt of `--tokens` (default 16384) tokens, prefilled in one forward on
each rank (model only, no scheduler), one torch thread per rank. Runs:

1. cp 1, DSA (index_topk 2048) vs cp 1, dense MLA (the same model with index_topk >= the prompt,
   so the indexer only stores its keys and attention is dense): prefill time;
2. cp 1 vs cp 2 (zigzag): Lightning Indexer time per rank (scoring + top-k, own queries only);
3. cp 1 vs cp 2: selected-token (sparse) attention time per rank.

Prints a markdown table. Wall times of the indexer / sparse attention are per rank; their thread
CPU times do not count time lost to other processes on a shared machine. `--quick` is a smoke
version (1K tokens, index_topk 128, 1 layer).

    python benchmark/dsa/run.py [--tokens 16384] [--topk 2048] [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections import defaultdict
from typing import Any

from tqdm import tqdm

SHAPE: dict[str, Any] = dict(
    vocab_size=1024, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256, num_hidden_layers=2,
    first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
    num_attention_heads=16, num_key_value_heads=16, q_lora_rank=384, kv_lora_rank=256, qk_nope_head_dim=64,
    qk_rope_head_dim=64, v_head_dim=64, index_n_heads=16, index_head_dim=64, max_position_embeddings=32768,
    bos_token_id=1, eos_token_id=2,
)  # fmt: skip
QUICK = dict(num_hidden_layers=1)

# (module, attribute) timed per rank: the indexer's selection and the selected-token attention
TIMED = {
    "indexer": [("sglang.srt.layers.attention.dsa.indexer", "index_topk_positions"),
                ("sglang.srt.layers.attention.mla_cp", "own_query_topk")],
    "sparse": [("sglang.srt.layers.attention.latent_attention", "sparse_latent_attention"),
               ("sglang.srt.layers.attention.mla_cp", "sparse_latent_attention")],
}  # fmt: skip


def _instrument(totals: dict[str, float]) -> None:
    """Wrap the timed functions (module attributes looked up at call time) with timers."""
    import importlib

    for kind, targets in TIMED.items():
        for module_name, attr in targets:
            module = importlib.import_module(module_name)
            fn = getattr(module, attr)

            def timed(*args, __fn=fn, __kind=kind, **kwargs):
                start, cpu = time.perf_counter(), time.thread_time()
                try:
                    return __fn(*args, **kwargs)
                finally:
                    totals[__kind] += time.perf_counter() - start
                    totals[__kind + "_cpu"] += time.thread_time() - cpu

            setattr(module, attr, timed)


def _rank(rank: int, cp: int, port: int, shape: dict, topk: int, tokens: int, repeats: int, out) -> None:
    import torch

    torch.set_num_threads(1)
    from transformers import DeepseekV32Config

    from sglang.srt.distributed.init import init_distributed
    from sglang.srt.distributed.parallel_layout import ParallelLayout
    from sglang.srt.distributed.parallel_state import ParallelGroups
    from sglang.srt.model_loader.dummy_loader import init_dummy_weights
    from sglang.srt.models.deepseek_v2 import DeepseekV32ForCausalLM
    from sglang.test.cp_forward_helpers import CPForwardHarness

    if cp > 1:
        init_distributed(cp, rank, f"127.0.0.1:{port}", "gloo")
        groups = ParallelGroups.build(ParallelLayout(tp=cp, attn_cp=cp), rank)
    else:
        groups = ParallelGroups.single()
    cfg = DeepseekV32Config(index_topk=topk, **shape)
    cfg.architectures = ["DeepseekV32ForCausalLM"]
    model = DeepseekV32ForCausalLM(cfg, groups, torch.float32).eval()
    init_dummy_weights(model, seed=0)
    totals: dict[str, float] = defaultdict(float)
    _instrument(totals)
    ids = torch.randint(3, cfg.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    indexers = [m.indexer for m in model.modules() if getattr(m, "indexer", None) is not None]
    runs = []
    for i in range(repeats + 1):  # the first, short prefill is a warm-up
        h = CPForwardHarness(cfg, groups.attn_cp, "zigzag", max_total_tokens=tokens + 256, max_requests=2,
                             max_context_len=tokens + 256)  # fmt: skip
        h.token_to_kv_pool = model.create_kv_pool(h.mapping.physical_pool_size(h.allocator.size), 1, torch.float32)
        totals.clear()
        for idx in indexers:
            idx.reset_counters()
        groups.attn_cp.barrier()
        start = time.perf_counter()
        h.forward(model, [(h.new_request(), ids if i else ids[:512])])
        elapsed = time.perf_counter() - start
        groups.attn_cp.barrier()
        if i:
            runs.append({"prefill": elapsed, "indexer": totals["indexer"], "sparse": totals["sparse"],
                         "indexer_cpu": totals["indexer_cpu"], "sparse_cpu": totals["sparse_cpu"],
                         "rows": sum(x.score_rows for x in indexers)})  # fmt: skip
    best = min(runs, key=lambda r: r["prefill"])
    out.put((rank, best))


def run(cp: int, shape: dict, topk: int, tokens: int, repeats: int) -> list[dict]:
    """Per-rank results (the fastest of `repeats` prefills) of one configuration."""
    from sglang.srt.distributed.init import get_free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = get_free_port()
    procs = [ctx.Process(target=_rank, args=(r, cp, port, shape, topk, tokens, repeats, out)) for r in range(cp)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=3600) for _ in procs)
    for p in procs:
        p.join()
    return [r for _, r in results]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1K tokens, index_topk 128, 1 layer")
    args = ap.parse_args()
    shape = dict(SHAPE)
    tokens, topk = args.tokens, args.topk
    if args.quick:
        shape.update(QUICK)
        tokens, topk = 1024, 128
    configs = [("cp1 DSA", 1, topk), ("cp1 dense MLA", 1, 1 << 30), ("cp2 DSA", 2, topk)]
    results: dict[str, list[dict]] = {}
    for name, cp, k in tqdm(configs, desc="dsa benchmark", unit="run"):
        results[name] = run(cp, shape, k, tokens, args.repeats)
    layers = shape["num_hidden_layers"]
    print(f"\nDeepSeek-V3.2 dummy ({layers} layers, 16 heads, latent 256+64, indexer 16x64), prompt {tokens} tokens, "
          f"index_topk {topk}, float32, 1 torch thread per rank\n")  # fmt: skip
    print("| run | rank | prefill (s) | indexer (s) | indexer CPU (s) | sparse attention (s) | sparse CPU (s) "
          "| indexer score rows |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, ranks in results.items():
        for r, x in enumerate(ranks):
            print(f"| {name} | {r} | {x['prefill']:.2f} | {x['indexer']:.2f} | {x['indexer_cpu']:.2f} | "
                  f"{x['sparse']:.2f} | {x['sparse_cpu']:.2f} | {x['rows']} |")  # fmt: skip
    dsa, dense, cp2 = results["cp1 DSA"][0], results["cp1 dense MLA"][0], results["cp2 DSA"]
    slowest = max(cp2, key=lambda r: r["prefill"])
    print()
    print(f"- prefill, DSA vs dense MLA (cp 1): {dsa['prefill']:.2f} s vs {dense['prefill']:.2f} s "
          f"({dense['prefill'] / dsa['prefill']:.2f}x)")
    print(f"- prefill, cp 2 vs cp 1 (DSA, slowest rank): {slowest['prefill']:.2f} s vs {dsa['prefill']:.2f} s "
          f"({dsa['prefill'] / slowest['prefill']:.2f}x)")
    for key, label in (("indexer", "indexer"), ("sparse", "sparse attention")):
        for k, unit in ((key, "wall"), (key + "_cpu", "thread CPU")):
            per_rank = ", ".join(f"{r[k]:.2f}" for r in cp2)
            worst = max(r[k] for r in cp2)
            print(f"- {label} per rank ({unit}), cp 2 vs cp 1: [{per_rank}] s vs {dsa[k]:.2f} s "
                  f"(slowest rank {worst / dsa[k]:.0%} of cp 1)" if dsa[k] else f"- {label}: not run")
    print(f"- indexer score rows, cp 2 ranks {[r['rows'] for r in cp2]} (sum {sum(r['rows'] for r in cp2)}) "
          f"vs cp 1 {dsa['rows']}")  # fmt: skip


if __name__ == "__main__":
    main()
