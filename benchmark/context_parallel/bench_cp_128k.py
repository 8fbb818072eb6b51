"""One very long prompt through the engine at cp 2 x pp 2 (issue 27): TTFT and peak memory per rank,
with and without the segmented prefix gather (`--cp-kv-gather-segment`).

The dummy DeepSeek-V3.2 of benchmark/dsa/run.py (2 layers, one per pipeline stage; hidden 1024, 16
heads, latent 256 + 64, indexer 16 x 64, index_topk 2048, dense MLP), float32 weights, the `dsa`
attention backend, one torch thread per rank (4 ranks: oversubscribed on a 2-core box, which
stretches wall time, not the memory figures). The prompt is prefilled in chunks of
`--chunk` tokens: every chunk after the first attends over the cached prefix, which each CP rank
gathers from its peer: whole (segment 0) or at most `segment` rows per round.

Per run: TTFT (wall of a max_new_tokens=1 request), and per rank process (`sglang-rank*`) the peak
resident set (VmHWM) and its growth over the resident set before the prompt.

    python benchmark/context_parallel/bench_cp_128k.py [--tokens 131072] [--chunk 16384]
        [--segments 0 16384] [--cp 2] [--pp 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dsa"))
from run import SHAPE  # noqa: E402


def write_config(root: str, tokens: int, topk: int) -> str:
    from transformers import DeepseekV32Config

    cfg = DeepseekV32Config(index_topk=topk, **{**SHAPE, "max_position_embeddings": tokens + 4096})
    cfg.architectures = ["DeepseekV32ForCausalLM"]
    path = os.path.join(root, "dsa-dummy-long")
    cfg.save_pretrained(path)
    return path


def rank_memory() -> dict[int, tuple[float, float]]:
    """(VmRSS, VmHWM) in MiB of every `sglang-rank*` process on the box, by pid."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if not f.read().startswith("sglang-rank"):
                    continue
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        out[int(pid)] = tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))
    return out


def run(path: str, args, segment: int) -> dict:
    import torch

    import sglang as sgl

    ids = torch.randint(3, SHAPE["vocab_size"], (args.tokens,), generator=torch.Generator().manual_seed(0))
    params = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}
    with sgl.Engine(
        model_path=f"dummy:{path}",
        load_format="dummy",
        dtype="float32",
        attention_backend="dsa",
        cp_size=args.cp,
        pp_size=args.pp,
        num_threads=1,
        chunked_prefill_size=args.chunk,
        cp_kv_gather_segment=segment,
        context_length=args.tokens + 64,
        max_total_tokens=args.tokens + 4096,
        disable_radix_cache=True,
        skip_tokenizer_init=True,
        log_level="warning",
    ) as llm:
        llm.generate(input_ids=ids[:256].tolist(), sampling_params=params)  # warm-up
        before = rank_memory()
        start = time.perf_counter()
        llm.generate(input_ids=ids.tolist(), sampling_params=params)
        ttft = time.perf_counter() - start
        after = rank_memory()
    ranks = sorted(after)
    return {
        "segment": segment,
        "ttft": ttft,
        "peak": [after[p][1] for p in ranks],
        "growth": [after[p][1] - before.get(p, after[p])[0] for p in ranks],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--chunk", type=int, default=16384)
    ap.add_argument("--segments", type=int, nargs="+", default=[0, 16384])
    ap.add_argument("--cp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--topk", type=int, default=2048)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as root:
        path = write_config(root, args.tokens, args.topk)
        for segment in args.segments:
            r = run(path, args, segment)
            rows.append(r)
            print(f"segment {segment}: TTFT {r['ttft']:.1f} s, peak RSS per rank {r['peak']}", flush=True)
    print(f"\n{args.tokens} tokens, cp {args.cp} x pp {args.pp}, chunk {args.chunk}, DSA dummy (float32)\n")
    print("| gather segment | TTFT, s | peak RSS per rank, MiB | growth over the pre-prompt RSS, MiB |")
    print("|---|---|---|---|")
    for r in rows:
        seg = "whole prefix" if r["segment"] == 0 else f"{r['segment']} rows"
        peak = " / ".join(f"{m:.0f}" for m in r["peak"])
        growth = " / ".join(f"{m:.0f}" for m in r["growth"])
        print(f"| {seg} | {r['ttft']:.1f} | {peak} | {growth} |")


if __name__ == "__main__":
    main()
