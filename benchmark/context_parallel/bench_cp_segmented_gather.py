"""Segmented prefix KV gather (`--cp-kv-gather-segment`): per-rank gathered rows and memory of one
prefill chunk over a long cached prefix, with and without the cap.

A dummy (random-weight) DeepSeek-V3.2-shaped model at tiny width but real row widths: latent 512 +
rope 64 and index keys 128 per token (4 heads, hidden 256, 2 layers, index_topk 2048, indexer 4
heads); float32, cp 2 (spawned gloo ranks, one torch thread each, CPForwardHarness). The prefix
(`--prefix` tokens, default 32768) is written straight into each rank's KV shard (random rows:
the numbers measured do not depend on them), then one chunk of `--chunk` tokens (default 2048)
runs over it, once per segment size (`--segments`, 0 = whole prefix at once), each in fresh
processes. Per rank it reports the probe's peak prefix rows gathered in one round, the peak
receive-buffer rows and bytes (per layer, the buffer the all-gather fills), the rounds, the chunk's wall time and the growth of the process's peak RSS
during the chunk (ru_maxrss after minus the RSS before: what the chunk's forward needed on top).

    python benchmark/context_parallel/bench_cp_segmented_gather.py [--prefix 32768] [--chunk 2048]
        [--segments 0 4096]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import tempfile
import time

from sglang.test.tiny_moe_models import DEEPSEEK_SIZES

# The tiny test model's MoE / routing sizes (`tiny_moe_models.DEEPSEEK_SIZES`) at DeepSeek-V3.2's row
# widths: latent 512 + rope 64, index keys 128.
SHAPE = {
    **DEEPSEEK_SIZES,
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "q_lora_rank": 128,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 64,
    "v_head_dim": 64,
    "index_n_heads": 4,
    "index_head_dim": 128,
    "index_topk": 2048,
    "max_position_embeddings": 65536,
    "torch_dtype": "float32",
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _fill_prefix(h, model, req, prefix: int) -> None:
    """Allocate `prefix` tokens for `req` and write random rows into this rank's shard of them."""
    import torch

    slots = h.allocator.alloc_extend([0], [prefix], [-1])
    h.req_to_token_pool.req_to_token[req.row, :prefix] = slots
    req.tokens = [3] * prefix
    owner, local = h.mapping.to_physical(slots.to(torch.int64))
    mine = local[owner == h.group.rank]
    g = torch.Generator().manual_seed(h.group.rank)
    pool = h.token_to_kv_pool
    for layer in range(model.start_layer, model.end_layer):
        width = pool.get_key_buffer(layer).reshape(pool.get_key_buffer(layer).shape[0], -1).shape[1]
        pool.set_kv_buffer(layer, mine, torch.randn(mine.numel(), width, generator=g))
        idx = pool.get_index_k_buffer(layer)
        pool.set_index_k_buffer(layer, mine, torch.randn(mine.numel(), idx.shape[-1], generator=g))


def _rank(rank: int, port: int, path: str, prefix: int, chunk: int, segment: int, out) -> None:
    import torch

    torch.set_num_threads(1)
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed.init import init_distributed
    from sglang.srt.distributed.parallel_layout import ParallelLayout
    from sglang.srt.distributed.parallel_state import ParallelGroups
    from sglang.srt.layers.attention.cp_probe import CPProbe
    from sglang.srt.layers.context_parallel import get_cp_layout
    from sglang.srt.model_loader.dummy_loader import init_dummy_weights
    from sglang.srt.models.registry import ModelRegistry
    from sglang.test.cp_forward_helpers import CPForwardHarness

    init_distributed(2, rank, f"127.0.0.1:{port}", "gloo")
    groups = ParallelGroups.build(ParallelLayout(tp=2, attn_cp=2), rank)
    cfg = ModelConfig(path).hf_config
    model = ModelRegistry.resolve(cfg.architectures)(cfg, groups, torch.float32).eval()
    init_dummy_weights(model, seed=0)
    total = prefix + chunk + 64
    h = CPForwardHarness(
        cfg, groups.attn_cp, "zigzag", max_total_tokens=total, max_requests=2, max_context_len=total
    )
    h.token_to_kv_pool = model.create_kv_pool(
        h.mapping.physical_pool_size(h.allocator.size), 1, torch.float32
    )
    req = h.new_request()
    _fill_prefix(h, model, req, prefix)
    ids = torch.randint(3, cfg.vocab_size, (chunk,), generator=torch.Generator().manual_seed(1)).tolist()
    fb = h.build_batch([(req, ids)])
    probe = CPProbe()
    layout = get_cp_layout(fb)
    layout.kv_gather_segment, layout.probe = segment, probe
    groups.attn_cp.barrier()
    rss0 = _rss_bytes()
    start = time.perf_counter()
    h.run(model, fb)
    groups.attn_cp.barrier()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.put(
        dict(
            rank=rank,
            segment=segment,
            seconds=round(seconds, 2),
            peak_round_rows=probe.peak_round_rows,
            peak_buffer_rows=probe.peak_buffer_rows,
            rounds=len(probe.rounds),
            peak_gather_buffer_mb=round(probe.peak_buffer_bytes / 2**20, 1),
            peak_rss_growth_mb=round(max(peak - rss0, 0) / 2**20, 1),
        )
    )


def run(path: str, prefix: int, chunk: int, segment: int) -> list[dict]:
    from sglang.srt.distributed.init import get_free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = get_free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, path, prefix, chunk, segment, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted((out.get(timeout=3600) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", type=int, default=32768)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--segments", type=int, nargs="+", default=[0, 4096])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        with open(os.path.join(root, "config.json"), "w") as f:
            json.dump(SHAPE, f)
        print(f"DeepSeek-V3.2 shape (tiny width): {json.dumps({k: SHAPE[k] for k in list(SHAPE)[2:]})}")
        print(f"cp 2, prefix {args.prefix}, chunk {args.chunk}, float32, 1 thread per rank")
        for segment in args.segments:
            for r in run(root, args.prefix, args.chunk, segment):
                print(json.dumps(r))


if __name__ == "__main__":
    main()
