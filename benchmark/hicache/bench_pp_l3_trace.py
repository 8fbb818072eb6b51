"""HiCache at pp 2: a prefix found on L3 is skipped by the whole pipeline, seen in the pipeline
trace (issue 31, measure d).

Two pp 2 engines, one after another, HiCache + the `file` storage tier on one directory, each with
its own pipeline trace (`--pp-trace-path`, managers/pp/trace.py):

- cold: a fresh engine, empty directory: the prompt (`--tokens` prefix + `--suffix` new tokens) is
  prefilled by both stages; its pages go to L3 (each stage writes its own layers' pages);
- L3 hit: a fresh engine on the same directory (empty KV pool and host tier): the same prefix + other
  new tokens; both stages load their layers' pages and the pipeline computes the suffix only.

From each trace, the timed request's `forward` events per stage: micro-batches, prompt tokens
computed (Σ extend_lens), the prefix each started after (prefix_lens of the first), busy seconds
(Σ duration) and the request's wall window (first forward start to last forward end over both
stages, benchmark/pp/trace_report.py). Also the client's TTFT and stage 0's HiCache counters.
A dummy Llama with SmolLM2-135M's shape, one torch thread per stage.

    python benchmark/hicache/bench_pp_l3_trace.py [--tokens 4096] [--chunk 1024] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "context_parallel"))
sys.path.insert(0, os.path.join(HERE, "..", "pp"))
from bench_cp_prefill import SMOLLM2_SHAPE, write_config  # noqa: E402
from trace_report import bubble_report, forwards, load_events  # noqa: E402

GREEDY = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}


def token_ids(n: int, seed: int) -> list[int]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, SMOLLM2_SHAPE["vocab_size"], (n,), generator=gen).tolist()


def pp2_engine(path: str, l3_dir: str, args, max_total_tokens: int, **extra):
    """A pp 2 engine of the dummy model at `path`, one thread per stage, HiCache with its file tier
    in `l3_dir` (`args`: dtype, chunk); `extra`: more server args."""
    import sglang as sgl

    return sgl.Engine(
        model_path=f"dummy:{path}",
        load_format="dummy",
        dtype=args.dtype,
        pp_size=2,
        num_threads=1,
        chunked_prefill_size=args.chunk,
        context_length=32768,
        max_total_tokens=max_total_tokens,
        enable_hierarchical_cache=True,
        hicache_storage_backend="file",
        hicache_storage_backend_extra_config=json.dumps({"file_path": l3_dir}),
        skip_tokenizer_init=True,
        log_level="warning",
        **extra,
    )


def run_engine(path: str, l3_dir: str, trace: str, prompt: list[int], rid: str, args) -> dict:
    """A fresh pp 2 engine: warm up (not the prefix), then the timed request; its TTFT and counters."""
    with pp2_engine(path, l3_dir, args, len(prompt) + 512, pp_trace_path=trace) as llm:
        llm.generate(input_ids=[5] * 64, sampling_params=GREEDY, rid=f"warm-{rid}")
        before = llm.get_server_info()["internal_states"][0]
        t0 = time.perf_counter()
        llm.generate(input_ids=prompt, sampling_params=GREEDY, rid=rid)
        ttft = time.perf_counter() - t0
        after = llm.get_server_info()["internal_states"][0]
        time.sleep(1.5)  # the entry rank merges the trace when the ring goes idle
    keys = ("prefill_tokens_computed", "hicache_l3_hit_tokens", "hicache_peer_missing_pages")
    return {"ttft": ttft, **{k: after.get(k, 0) - before.get(k, 0) for k in keys}}


def stage_figures(trace: str, rid: str) -> tuple[dict, float]:
    """Per stage: micro-batches, tokens computed, first prefix, busy s; and the request's window."""
    from sglang.srt.managers.pp.trace import merge_trace

    merge_trace(trace)
    events = load_events(trace)
    per: dict[int, dict] = defaultdict(lambda: {"mbs": 0, "computed": 0, "prefix": None, "busy": 0.0})
    for e in sorted(forwards(events), key=lambda e: e["ts"]):
        a = e["args"]
        if rid not in a.get("rids", []):
            continue
        s = per[int(a["pp_rank"])]
        i = a["rids"].index(rid)
        s["mbs"] += 1
        s["computed"] += a["extend_lens"][i]
        s["prefix"] = a["prefix_lens"][i] if s["prefix"] is None else s["prefix"]
        s["busy"] += e["dur"] / 1e6
    return dict(per), bubble_report(events, rid).wall_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=4096, help="prefix length")
    ap.add_argument("--suffix", type=int, default=64, help="new tokens after the prefix")
    ap.add_argument("--chunk", type=int, default=1024, help="--chunked-prefill-size")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--quick", action="store_true", help="a 512-token prefix (a smoke run, not a figure)")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.chunk = 512, 256
    prefix = token_ids(args.tokens, 0)
    runs = {"cold (prefilled)": ("cold", 1), "L3 hit (fresh engine)": ("l3hit", 2)}
    out = {}
    with tempfile.TemporaryDirectory() as root:
        path = write_config(root)
        for name, (rid, seed) in tqdm(runs.items(), desc="engines", unit="engine"):
            trace = os.path.join(root, f"{rid}.json")
            prompt = prefix + token_ids(args.suffix, 100 + seed)
            info = run_engine(path, os.path.join(root, "l3"), trace, prompt, rid, args)
            out[name] = (info, *stage_figures(trace, rid))
    print(
        f"\npp 2, prefix {args.tokens} + {args.suffix} new tokens, --chunked-prefill-size {args.chunk}, "
        f"SmolLM2 shape, {args.dtype}, 1 thread per stage; file L3\n"
    )
    print(
        "| request | TTFT s | stage | forwards | prompt tokens computed | prefix skipped | busy s | "
        "request window s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, (info, per, wall) in out.items():
        for stage in sorted(per):
            s = per[stage]
            print(
                f"| {name} | {info['ttft']:.3f} | {stage} | {s['mbs']} | {s['computed']} | {s['prefix']} | "
                f"{s['busy']:.3f} | {wall:.3f} |"
            )
    for name, (info, _, _) in out.items():
        print(
            f"{name}: stage 0 counters: computed {info['prefill_tokens_computed']}, L3 hit "
            f"{info['hicache_l3_hit_tokens']}, peer missing pages {info['hicache_peer_missing_pages']}"
        )


if __name__ == "__main__":
    main()
