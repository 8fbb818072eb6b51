"""Strong scaling of chunked pipeline prefill: TTFT of one long prompt at pp = 1, 2, 4.

Model: a dummy (random-weight) Llama with SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads,
3 KV heads, intermediate 1536, vocab 49152), context raised to 16K. One torch thread per rank,
radix cache off, the same chunk size for every pp. Efficiency = T1 / (N · TN).

    python benchmark/pp/bench_pp_ttft.py --chunk-sizes 512,1024,2048 --pp 1,2,4 --repeats 3 \
        --out benchmark/pp/results.json --trace benchmark/pp/trace_pp2.json --trace-pp 2 --trace-chunk 512

With --trace, one extra pp = `--trace-pp` engine runs with `--pp-trace-path` and measures one
prompt; `trace_report.py` then gives its per-stage bubble ratios and a PNG timeline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
from tqdm import tqdm

import sglang as sgl

SMOLLM2_SHAPE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


def write_config_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(SMOLLM2_SHAPE, f, indent=2)
    return path


def engine_kwargs(
    model_dir: str, pp: int, chunk: int, prompt_len: int, dtype: str, trace: str | None
) -> dict:
    return dict(
        model_path=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype=dtype,
        pp_size=pp,
        num_threads=1,
        chunked_prefill_size=chunk,
        context_length=16384,
        max_total_tokens=prompt_len + 512,
        disable_radix_cache=True,
        log_level="warning",
        pp_trace_path=trace,
    )


def cpu_busy(interval: float = 1.0) -> float:
    """Share of all CPUs busy over `interval` seconds (from /proc/stat)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return values[3] + values[4], sum(values)  # idle + iowait, total

    idle0, total0 = sample()
    time.sleep(interval)
    idle1, total1 = sample()
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def wait_for_quiet(max_busy: float, timeout_s: float = 900.0) -> float:
    """On a shared machine, wait until other processes leave the CPUs (mostly) idle; returns the
    busy share seen last (recorded with each run)."""
    deadline = time.monotonic() + timeout_s
    busy = cpu_busy()
    while busy > max_busy and time.monotonic() < deadline:
        busy = cpu_busy()
    return busy


def ttft(llm, prompt: list[int], rid: str) -> float:
    """Seconds from submit to the first (only) token."""
    start = time.perf_counter()
    llm.generate(input_ids=prompt, sampling_params={"max_new_tokens": 1, "temperature": 0}, rid=rid)
    return time.perf_counter() - start


def measure(
    model_dir, pp, chunk, prompt, dtype, repeats, bar, max_busy, trace=None
) -> tuple[list[float], list[float]]:
    """TTFTs of `repeats` runs, and the background CPU share seen before each."""
    with sgl.Engine(**engine_kwargs(model_dir, pp, chunk, len(prompt), dtype, trace)) as llm:
        ttft(llm, prompt[: 2 * chunk], f"warmup-pp{pp}-c{chunk}")  # first-call overheads
        times, background = [], []
        for i in range(repeats):
            background.append(wait_for_quiet(max_busy))
            times.append(ttft(llm, prompt, f"ttft-pp{pp}-c{chunk}-{i}"))
            bar.update(1)
            bar.set_postfix(pp=pp, chunk=chunk, ttft=f"{times[-1]:.1f}s")
        if trace:
            time.sleep(1.5)  # the entry rank merges the trace parts when the ring goes idle
    return times, background


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-len", type=int, default=8192)
    ap.add_argument("--chunk-sizes", default="512,1024,2048")
    ap.add_argument("--pp", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default="benchmark/pp/results.json")
    ap.add_argument("--trace", default=None, help="also write a pipeline trace of one run here")
    ap.add_argument("--trace-pp", type=int, default=2)
    ap.add_argument("--trace-chunk", type=int, default=512)
    ap.add_argument(
        "--max-background-busy",
        type=float,
        default=0.1,
        help="before each run wait until the CPUs are at most this busy (shared machines)",
    )
    args = ap.parse_args()

    chunks = [int(c) for c in args.chunk_sizes.split(",")]
    pps = [int(p) for p in args.pp.split(",")]
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, SMOLLM2_SHAPE["vocab_size"], (args.prompt_len,), generator=gen).tolist()
    model_dir = write_config_dir(os.path.join(tempfile.gettempdir(), "sglang-bench-pp-smollm2-shape"))
    total = len(chunks) * len(pps) * args.repeats + (1 if args.trace else 0)
    results: dict = {"prompt_len": args.prompt_len, "dtype": args.dtype, "repeats": args.repeats, "runs": []}
    with tqdm(total=total, desc="TTFT runs") as bar:
        for chunk in chunks:
            for pp in pps:
                times, background = measure(
                    model_dir, pp, chunk, prompt, args.dtype, args.repeats, bar, args.max_background_busy
                )
                results["runs"].append(
                    {
                        "pp": pp,
                        "chunk": chunk,
                        "ttft_s": times,
                        "median_s": statistics.median(times),
                        "background_cpu_busy": background,
                    }
                )
        if args.trace:
            for p in (args.trace, *[f"{args.trace}.rank{r}.part" for r in range(8)]):
                if os.path.exists(p):
                    os.remove(p)
            times, _ = measure(
                model_dir,
                args.trace_pp,
                args.trace_chunk,
                prompt,
                args.dtype,
                1,
                bar,
                args.max_background_busy,
                trace=args.trace,
            )
            results["trace"] = {
                "path": args.trace,
                "pp": args.trace_pp,
                "chunk": args.trace_chunk,
                "ttft_s": times[0],
            }
    from sglang.srt.managers.pp.trace import merge_trace

    if args.trace:
        merge_trace(args.trace)
    results["table"] = _table(results["runs"])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    print(results["table"])


def _table(runs: list[dict]) -> str:
    """The markdown table of the runs (each run gets its `efficiency`)."""
    base = {r["chunk"]: r["median_s"] for r in runs if r["pp"] == 1}
    lines = [
        "| chunk | pp | TTFT median (s) | runs (s) | speed-up | efficiency T1/(N·TN) | background CPU before runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        t1 = base.get(r["chunk"])
        speedup = t1 / r["median_s"] if t1 else float("nan")
        r["efficiency"] = speedup / r["pp"]
        lines.append(
            f"| {r['chunk']} | {r['pp']} | {r['median_s']:.2f} | {', '.join(f'{t:.2f}' for t in r['ttft_s'])} "
            f"| {speedup:.2f}× | {100 * r['efficiency']:.1f} % "
            f"| {', '.join(f'{100 * b:.0f} %' for b in r['background_cpu_busy'])} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
