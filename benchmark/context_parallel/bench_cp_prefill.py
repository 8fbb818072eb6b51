"""Context-parallel prefill: time to first token of one long prompt at cp = 1 vs cp = 2.

A dummy (random-weight) Llama with SmolLM2-135M's shape (30 layers, hidden 576, 9 heads / 3 KV
heads, vocab 49152) and a 32K context; one prompt of `--tokens` tokens (default 16384), one torch
thread per rank. Two modes:

- `--mode engine` (default): `sgl.Engine(..., cp_size=N, num_threads=1)`, the prompt is sent
  with max_new_tokens=1 and the wall time of `generate` is the TTFT; `--pp 2` adds pp = 2.
- `--mode model`: the model alone on each rank (spawned gloo ranks, CPForwardHarness), timing one
  forward of the whole prompt (no scheduler / process overhead).

Reports TTFT per cp size, the CP efficiency T1 / (cp · Tcp) and the KV-cache bytes each rank
stores for the prompt.

    python benchmark/context_parallel/bench_cp_prefill.py --cp 1 2 [--tokens 16384] [--mode model]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time

SMOLLM2_SHAPE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "max_position_embeddings": 32768,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


def write_config(root: str) -> str:
    path = os.path.join(root, "smollm2-shape-32k")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(SMOLLM2_SHAPE, f)
    return path


def prompt_ids(n: int) -> list[int]:
    import torch

    return torch.randint(
        3, SMOLLM2_SHAPE["vocab_size"], (n,), generator=torch.Generator().manual_seed(0)
    ).tolist()


def kv_bytes_per_rank(tokens: int, cp: int, pp: int, dtype_bytes: int = 2) -> int:
    c = SMOLLM2_SHAPE
    per_token_layer = 2 * c["num_key_value_heads"] * c["head_dim"] * dtype_bytes
    return -(-tokens // cp) * per_token_layer * (c["num_hidden_layers"] // pp)


# ---------------------------------------------------------------------------- engine mode
def rank_cpu_seconds() -> dict[int, float]:
    """CPU seconds used so far by this process's scheduler ranks (`sglang-rank*`: its children,
    or on CPU its fork server's)."""
    out, tick, procs = {}, os.sysconf("SC_CLK_TCK"), {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        procs[int(pid)] = (comm, int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    mine = {os.getpid()}
    mine |= {pid for pid, (_, ppid, _) in procs.items() if ppid in mine}  # children (the fork server)
    for pid, (comm, ppid, cpu) in procs.items():
        if comm.startswith("sglang-rank") and ppid in mine:
            out[pid] = cpu
    return out


def run_engine(
    path: str, cp: int, pp: int, tokens: int, repeats: int, dtype: str, **extra
) -> tuple[list[float], list[float]]:
    """TTFT of each run and the busiest rank's CPU seconds; `extra`: more Engine arguments."""
    import sglang as sgl

    ids = prompt_ids(tokens)
    times = []
    with sgl.Engine(
        model_path=f"dummy:{path}",
        load_format="dummy",
        dtype=dtype,
        cp_size=cp,
        pp_size=pp,
        num_threads=1,
        chunked_prefill_size=-1,
        max_prefill_tokens=tokens + 16,
        context_length=32768,
        max_total_tokens=tokens + 4096,
        disable_radix_cache=True,
        skip_tokenizer_init=True,
        log_level="warning",
        **extra,
    ) as llm:
        params = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}
        llm.generate(input_ids=ids[:64], sampling_params=params)  # warm up
        cpu = []  # busiest rank's CPU seconds per run: the compute split, whatever else runs on the box
        for _ in range(repeats):
            before = rank_cpu_seconds()
            start = time.perf_counter()
            llm.generate(input_ids=ids, sampling_params=params)
            times.append(time.perf_counter() - start)
            after = rank_cpu_seconds()
            cpu.append(max(after[p] - before.get(p, 0.0) for p in after))
    return times, cpu


# ---------------------------------------------------------------------------- model mode
def _model_rank(rank: int, cp: int, port: int, path: str, tokens: int, repeats: int, dtype: str, out) -> None:
    import torch

    torch.set_num_threads(1)
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed.init import init_distributed
    from sglang.srt.distributed.parallel_layout import ParallelLayout
    from sglang.srt.distributed.parallel_state import ParallelGroups
    from sglang.srt.model_loader.dummy_loader import init_dummy_weights
    from sglang.srt.models.registry import ModelRegistry
    from sglang.test.cp_forward_helpers import CPForwardHarness

    tdtype = getattr(torch, dtype)
    if cp > 1:
        init_distributed(cp, rank, f"127.0.0.1:{port}", "gloo")
        groups = ParallelGroups.build(ParallelLayout(tp=cp, attn_cp=cp), rank)
    else:
        groups = ParallelGroups.single()
    cfg = ModelConfig(path).hf_config
    model = ModelRegistry.resolve(cfg.architectures)(cfg, groups, tdtype).eval()
    init_dummy_weights(model, seed=0)
    ids = prompt_ids(tokens)
    times = []
    for _ in range(repeats):
        h = CPForwardHarness(
            cfg,
            groups.attn_cp,
            "zigzag",
            dtype=tdtype,
            max_total_tokens=tokens + 64,
            max_requests=2,
            max_context_len=tokens + 64,
        )
        req = h.new_request()
        groups.attn_cp.barrier()
        start = time.perf_counter()
        h.forward(model, [(req, ids)])
        groups.attn_cp.barrier()
        times.append(time.perf_counter() - start)
    kv = (
        h.stored_rows() * 2 * cfg.num_key_value_heads * cfg.head_dim * tdtype.itemsize * cfg.num_hidden_layers
    )
    out.put((rank, times, kv))


def run_model(path: str, cp: int, tokens: int, repeats: int, dtype: str) -> tuple[list[float], int]:
    from sglang.srt.distributed.init import get_free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = get_free_port()
    procs = [
        ctx.Process(target=_model_rank, args=(r, cp, port, path, tokens, repeats, dtype, out))
        for r in range(cp)
    ]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=3600) for _ in procs)
    for p in procs:
        p.join()
    times = [max(ts) for ts in zip(*(r[1] for r in results))]
    return times, max(r[2] for r in results)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--mode", choices=["engine", "model"], default="engine")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        path = write_config(root)
        ttft: dict[int, float] = {}
        cpu_s: dict[int, float] = {}
        for cp in args.cp:
            cpu = None
            if args.mode == "engine":
                times, cpu = run_engine(path, cp, args.pp, args.tokens, args.repeats, args.dtype)
                kv = kv_bytes_per_rank(args.tokens, cp, args.pp)
                cpu_s[cp] = statistics.median(cpu)
            else:
                times, kv = run_model(path, cp, args.tokens, args.repeats, args.dtype)
            ttft[cp] = statistics.median(times)
            runs = ", ".join(f"{t:.2f}" for t in times)
            print(
                f"mode={args.mode} pp={args.pp} cp={cp} tokens={args.tokens}: TTFT {ttft[cp]:.2f} s "
                f"(runs {runs}), KV per rank {kv / 2**20:.1f} MiB"
                + ("" if cpu is None else f", busiest rank CPU {cpu_s[cp]:.2f} s"),
                flush=True,
            )
        base = ttft.get(1)
        for cp, t in ttft.items():
            if base and cp > 1:
                print(f"cp={cp}: speedup {base / t:.2f}x, efficiency T1/(cp*Tcp) = {base / (cp * t):.1%}")
                if 1 in cpu_s and cp in cpu_s:
                    print(
                        f"cp={cp}: CPU-time efficiency cpu1/(cp*cpu_busiest) = {cpu_s[1] / (cp * cpu_s[cp]):.1%}"
                    )


if __name__ == "__main__":
    main()
