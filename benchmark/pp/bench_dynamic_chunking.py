"""Dynamic chunking at pp = 2: TTFT and bubble ratio of one long prompt under each chunk policy.

Policies: fixed chunks (a sweep of --chunked-prefill-size), upstream dynamic chunking
(`--enable-dynamic-chunking`, SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR α, base chunk = the best fixed
chunk of the sweep, i.e. upstream after its hand search) and ours (`--dynamic-chunking-mode auto`
with the default base chunk, no sweep). Model: the dummy Llama of SmolLM2-135M's shape from
bench_pp_ttft.py with a 32K context; one torch thread per rank; radix cache off.

    python benchmark/pp/bench_dynamic_chunking.py --prompt-len 16384 --fixed 512,1024,2048,4096 \
        --alphas 0.65,0.75,0.85 --auto-chunk 2048 --repeats 2 --out benchmark/pp/dynamic_chunking.json

Every timed run writes a PP trace; the bubble ratio (1 − Σ busy / (P · wall) over the prompt's
forwards) and the chunk sizes stage 0 ran come from it (trace_report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from tqdm import tqdm

import sglang as sgl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_pp_ttft import SMOLLM2_SHAPE, wait_for_quiet  # noqa: E402
from trace_report import bubble_report, load_events  # noqa: E402

CONTEXT = 32768


def write_model(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump({**SMOLLM2_SHAPE, "max_position_embeddings": CONTEXT}, f, indent=2)
    return path


def run_policy(model_dir: str, name: str, flags: dict, env: dict, prompt: list[int], args, bar) -> dict:
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the engine's rank processes inherit it
    trace_dir = tempfile.mkdtemp(prefix=f"dc-{name.replace(' ', '_')}-")
    kwargs = dict(
        model_path=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype=args.dtype,
        pp_size=args.pp,
        num_threads=1,
        context_length=CONTEXT,
        max_total_tokens=len(prompt) + 512,
        disable_radix_cache=True,
        log_level="warning",
        pp_trace_path=os.path.join(trace_dir, "t.json"),
        **flags,
    )
    t_start = time.perf_counter()
    try:
        with sgl.Engine(**kwargs) as llm:
            startup = time.perf_counter() - t_start
            llm.generate(input_ids=prompt[:1024], sampling_params={"max_new_tokens": 1}, rid=f"warm-{name}")
            times, background = [], []
            for i in range(args.repeats):
                background.append(wait_for_quiet(args.max_background_busy))
                t0 = time.perf_counter()
                llm.generate(
                    input_ids=prompt, sampling_params={"max_new_tokens": 1, "temperature": 0}, rid=f"p{i}"
                )
                times.append(time.perf_counter() - t0)
                bar.update(1)
                bar.set_postfix(policy=name, ttft=f"{times[-1]:.1f}s")
            time.sleep(1.5)  # the entry rank merges the trace when the ring goes idle
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    from sglang.srt.managers.pp.trace import merge_trace

    trace = os.path.join(trace_dir, "t.json")
    merge_trace(trace)
    events = load_events(trace)
    rid = f"p{args.repeats - 1}"
    report = bubble_report(events, rid)
    chunks = [
        e["args"]["extend_lens"][0]
        for e in events
        if e.get("ph") == "X" and e["name"] == "forward" and e["pid"] == 0 and e["args"].get("rids") == [rid]
    ]
    return {
        "policy": name,
        "flags": flags,
        "env": env,
        "ttft_s": times,
        "median_s": statistics.median(times),
        "bubble": report.overall_bubble,
        "bubble_per_stage": report.bubble,
        "chunks": chunks,
        "startup_s": startup,
        "background_cpu_busy": background,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-len", type=int, default=16384)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--fixed", default="512,1024,2048,4096")
    ap.add_argument("--alphas", default="0.65,0.75,0.85")
    ap.add_argument(
        "--auto-chunk", type=int, default=2048, help="--chunked-prefill-size for auto (sets C // 4)"
    )
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-background-busy", type=float, default=0.15)
    ap.add_argument("--out", default="benchmark/pp/dynamic_chunking.json")
    args = ap.parse_args()

    fixed = [int(c) for c in args.fixed.split(",") if c]
    alphas = [float(a) for a in args.alphas.split(",") if a]
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, SMOLLM2_SHAPE["vocab_size"], (args.prompt_len,), generator=gen).tolist()
    model_dir = write_model(os.path.join(tempfile.gettempdir(), "sglang-bench-dc-smollm2-shape"))
    runs: list[dict] = []
    total = (len(fixed) + len(alphas) + 1) * args.repeats
    with tqdm(total=total, desc="policies") as bar:
        for c in fixed:
            runs.append(
                run_policy(model_dir, f"fixed {c}", {"chunked_prefill_size": c}, {}, prompt, args, bar)
            )
        best = min((r for r in runs), key=lambda r: r["median_s"])
        best_c = best["flags"]["chunked_prefill_size"]
        for a in alphas:
            flags = {"chunked_prefill_size": best_c, "enable_dynamic_chunking": True}
            env = {"SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR": str(a)}
            runs.append(run_policy(model_dir, f"upstream C={best_c} α={a}", flags, env, prompt, args, bar))
        flags = {"chunked_prefill_size": args.auto_chunk, "dynamic_chunking_mode": "auto"}
        runs.append(run_policy(model_dir, f"auto (C={args.auto_chunk})", flags, {}, prompt, args, bar))

    lines = [
        "| policy | TTFT median (s) | runs (s) | vs best fixed | bubble ratio | chunks (stage 0) |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        ch = r["chunks"]
        shown = (
            ", ".join(map(str, ch))
            if len(ch) <= 12
            else ", ".join(map(str, ch[:6])) + f", … ({len(ch)} chunks)"
        )
        lines.append(
            f"| {r['policy']} | {r['median_s']:.2f} | {', '.join(f'{t:.2f}' for t in r['ttft_s'])} "
            f"| {r['median_s'] / best['median_s']:.3f}× | {100 * r['bubble']:.1f} % | {shown} |"
        )
    table = "\n".join(lines)
    out = {
        "prompt_len": args.prompt_len,
        "pp": args.pp,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "best_fixed": best_c,
        "runs": runs,
        "table": table,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2, default=str)
    print(table)


if __name__ == "__main__":
    main()
