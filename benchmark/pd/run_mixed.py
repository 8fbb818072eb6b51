"""PD disaggregation vs a colocated server on a mixed workload (docs/benchmarks.md, "PD").

Short chat requests decode while long prompts (4K-8K tokens) arrive: a `sglang.bench_serving`
run of short requests, and once it is sending, long prompts one after another (this script's own
client, pre-tokenized, so they arrive at a known time) until the short run ends. Configurations
(`--layout smollm2`, SmolLM2-135M):
  colocated: one server, --num-threads 2;
  pd:        prefill + decode servers, --num-threads 1 each, behind sglang-router (Mooncake, TCP).
`--layout seeds`: the seeds' recommended layout (layouts.py: a dummy DeepSeek-V3.2 sized for this
machine, prefill --cp-size 2, decode --tp-size 2 --dp-size 2 --enable-dp-attention --ep-size 2)
against a colocated server of the same four ranks (`--colocated-layout`), one thread per rank.
Prints each run's "Serving Benchmark Result" and a summary (ITL P99, TTFT median / P99, output
tokens/s of the short requests; the long requests' TTFT); for PD also the KV transfer of every
long prompt (MB/s, ms, fraction of the transfer that overlapped the prompt's later chunks).

  python benchmark/pd/run_mixed.py --config both --out /tmp/pd_bench.jsonl
  python benchmark/pd/run_mixed.py --layout seeds --config both --out /tmp/pd_seeds.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np
from tqdm import tqdm

from layouts import COLOCATED_SEEDS, build_layout
from sglang.srt.distributed.init import get_free_port as free_port

PY = sys.executable


def spawn(cmd: list[str], name: str) -> subprocess.Popen:
    log = open(tempfile.NamedTemporaryFile(prefix=f"pd-bench-{name}-", suffix=".log", delete=False).name, "w")
    print(f"[{name}] {' '.join(cmd)}  (log {log.name})", flush=True)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_http(url: str, path: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=120).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url}{path} not ready")


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def server_cmd(port: int, threads: int, args: argparse.Namespace, extra: list[str]) -> list[str]:
    return [
        PY,
        "-m",
        "sglang.launch_server",
        "--port",
        str(port),
        "--num-threads",
        str(threads),
        "--dtype",
        args.dtype,
        "--chunked-prefill-size",
        str(args.chunk),
        "--log-level",
        "warning",
        "--max-total-tokens",
        str(args.max_total_tokens),
        *args.layout.model_args,
        *extra,
        *([] if args.short_first is None else ["--short-prompt-first-tokens", str(args.short_first)]),
    ]


def start(config: str, args: argparse.Namespace) -> tuple[str, list[subprocess.Popen], str]:
    """(url clients use, processes, prefill url or '')"""
    if config == "colocated":
        port = free_port()
        threads = args.layout.colocated_threads or args.colocated_threads
        p = spawn(server_cmd(port, threads, args, args.layout.colocated), "colocated")
        url = f"http://127.0.0.1:{port}"
        wait_http(url, "/health_generate")
        return url, [p], ""
    pp, dp, bp, rp = free_port(), free_port(), free_port(), free_port()
    prefill = spawn(
        server_cmd(
            pp,
            1,
            args,
            [
                *args.layout.prefill,
                "--disaggregation-mode",
                "prefill",
                "--disaggregation-bootstrap-port",
                str(bp),
            ],
        ),
        "prefill",
    )
    decode = spawn(
        server_cmd(dp, 1, args, [*args.layout.decode, "--disaggregation-mode", "decode"]), "decode"
    )
    procs = [prefill, decode]
    wait_http(f"http://127.0.0.1:{pp}", "/health_generate")
    wait_http(f"http://127.0.0.1:{dp}", "/health_generate")
    router = spawn(
        [
            PY,
            "-m",
            "sglang_router.launch_router",
            "--pd-disaggregation",
            "--prefill",
            f"http://127.0.0.1:{pp}",
            str(bp),
            "--decode",
            f"http://127.0.0.1:{dp}",
            "--host",
            "127.0.0.1",
            "--port",
            str(rp),
            "--log-level",
            "warn",
        ],
        "router",
    )
    procs.append(router)
    url = f"http://127.0.0.1:{rp}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # the router registers its workers in the background
        try:
            r = httpx.post(
                url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=120
            )
            if r.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    return url, procs, f"http://127.0.0.1:{pp}"


def bench(url: str, name: str, out_file: str, args: argparse.Namespace, **kw) -> subprocess.Popen:
    cmd = [
        PY,
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang",
        "--base-url",
        url,
        "--dataset-name",
        "random",
        "--random-range-ratio",
        str(kw.pop("ratio")),
        "--output-file",
        out_file,
        "--seed",
        str(args.seed),
        "--disable-tqdm",
        "--tokenizer",
        args.tokenizer,
    ]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    print(f"[bench {name}] {' '.join(cmd)}", flush=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # its "#Input tokens" line marks the first request
    return subprocess.Popen(cmd, stdout=open(out_file + ".txt", "w"), stderr=subprocess.STDOUT, env=env)


def wait_started(proc: subprocess.Popen, log_path: str, timeout: float = 600) -> None:
    """Until a bench_serving run has built its dataset and starts sending."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if "#Input tokens" in open(log_path).read():
            return
        time.sleep(0.2)
    raise RuntimeError(f"the benchmark client did not start: {open(log_path).read()[-2000:]}")


def transfer_summary(prefill_url: str, min_tokens: int) -> list[dict]:
    state = httpx.get(prefill_url + "/get_server_info", timeout=60).json()["internal_states"][0]
    rows = []
    for t in state.get("pd_recent_transfers", []):
        chunks = t["chunks"]
        tokens = sum(c["tokens"] for c in chunks)
        if tokens < min_tokens:
            continue
        busy = sum(c["done"] - c["started"] for c in chunks)
        last_queued = chunks[-1]["queued"]
        overlap = sum(max(0.0, min(c["done"], last_queued) - c["started"]) for c in chunks)
        rows.append(
            {
                "tokens": tokens,
                "chunks": len(chunks),
                "mb": t["bytes"] / 2**20,
                "transfer_ms": busy * 1e3,
                "mb_per_s": t["bytes"] / 2**20 / busy if busy else None,
                "overlap_fraction": overlap / busy if busy else None,
            }
        )
    return rows


def long_client(url: str, args: argparse.Namespace, until: subprocess.Popen) -> list[dict]:
    """Long prompts (pre-tokenized random ids, lengths uniform in [long_input / 2, long_input]),
    one at a time through /generate with streaming, from now until `until` (the short run) ends
    (at least one, at most --long-prompts). Returns each prompt's length and TTFT."""
    rng = np.random.default_rng(args.seed + 1)
    rows = []
    while len(rows) < args.long_prompts and (not rows or until.poll() is None):
        n = int(rng.integers(args.long_input // 2, args.long_input + 1))
        ids = [int(i) for i in rng.integers(*args.layout.id_range, n)]
        body = {
            "input_ids": ids,
            "stream": True,
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True},
        }
        t0, first = time.perf_counter(), None
        with httpx.stream("POST", url + "/generate", json=body, timeout=1800) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and first is None:
                    first = time.perf_counter() - t0
        rows.append({"tokens": n, "ttft_s": first, "e2e_s": time.perf_counter() - t0})
    return rows


def _server_flags(args: argparse.Namespace) -> dict:
    lay = args.layout
    return {"prefill": lay.prefill, "decode": lay.decode, "colocated": lay.colocated, "model": lay.model_args}


def run(config: str, args: argparse.Namespace) -> dict:
    url, procs, prefill_url = start(config, args)
    try:
        tmp = tempfile.mkdtemp(prefix=f"pd-bench-{config}-")
        short_out = os.path.join(tmp, "short.jsonl")
        # The short run first; once its client is sending (dataset built, then one warm-up
        # request) and --long-delay-s later, long prompts arrive one after another for as long as
        # the short run lasts, so its requests decode while long prompts prefill on both setups.
        short = bench(
            url,
            "short",
            short_out,
            args,
            ratio=0.5,
            random_input_len=args.short_input,
            random_output_len=args.short_output,
            num_prompts=args.short_prompts,
            max_concurrency=args.short_concurrency,
            request_rate="inf",
        )
        wait_started(short, short_out + ".txt")
        time.sleep(args.long_delay_s)
        longs = long_client(url, args, until=short)
        with tqdm(desc=f"{config}: waiting for the short run", unit="s") as bar:
            while short.poll() is None:
                time.sleep(1)
                bar.update(1)
        res = {
            "config": config,
            "args": {k: v for k, v in vars(args).items() if k != "layout"},
            "layout": {"name": args.layout.name, "shape": args.layout.shape, "servers": _server_flags(args)},
            "loadavg_end": os.getloadavg(),
            "long_prompts": longs,
        }
        print(open(short_out + ".txt").read()[-2500:], flush=True)
        with open(short_out) as f:
            res["short"] = json.loads(f.read().strip().splitlines()[-1])
        if prefill_url:
            # a CP prefill's first rank sends only the positions it stores (1 / cp of the prompt)
            res["transfers"] = transfer_summary(prefill_url, args.long_input // 2 // args.layout.prefill_cp)
        return res
    finally:
        stop(procs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=["colocated", "pd", "both"], default="both")
    ap.add_argument("--layout", choices=["smollm2", "seeds"], default="smollm2", help="see layouts.py")
    ap.add_argument(
        "--colocated-layout",
        choices=sorted(COLOCATED_SEEDS),
        default="dp2-cp2",
        help="--layout seeds: the colocated server's four-rank layout (layouts.py)",
    )
    ap.add_argument(
        "--attention-backend", default="dsa", help="--layout seeds: every server's attention backend"
    )
    ap.add_argument("--dtype", default="auto", help="--dtype of every server (auto: per CPU kind)")
    ap.add_argument(
        "--colocated-threads",
        type=int,
        default=2,
        help="torch threads of the colocated server (--layout smollm2)",
    )
    ap.add_argument("--chunk", type=int, default=1024, help="--chunked-prefill-size of the prefilling server")
    ap.add_argument(
        "--short-first",
        type=int,
        default=None,
        help="--short-prompt-first-tokens of the prefilling server (default: the server's default)",
    )
    ap.add_argument("--max-total-tokens", type=int, default=40000)
    ap.add_argument("--short-input", type=int, default=128)
    ap.add_argument("--short-output", type=int, default=128)
    ap.add_argument("--short-prompts", type=int, default=24)
    ap.add_argument("--short-concurrency", type=int, default=4)
    ap.add_argument("--long-input", type=int, default=8192, help="long prompts: uniform in [len/2, len]")
    ap.add_argument("--long-prompts", type=int, default=8, help="at most; they stop when the short run ends")
    ap.add_argument(
        "--long-delay-s",
        type=float,
        default=8.0,
        help="after the short client starts sending (its warm-up request takes a few seconds)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--out", default=None, help="append one JSON line per configuration")
    args = ap.parse_args()
    args.layout = build_layout(args.layout, args.colocated_layout, args.attention_backend)
    if args.layout.dtype and args.dtype == "auto":
        args.dtype = args.layout.dtype
    args.tokenizer = args.tokenizer or args.layout.tokenizer
    if args.tokenizer is None:
        from sglang.srt.model_loader.default_model import find_default_model

        args.tokenizer = find_default_model()
    configs = ["colocated", "pd"] if args.config == "both" else [args.config]
    results = [run(c, args) for c in configs]
    print("\n=== summary ===")
    for r in results:
        s = r["short"]
        long_ttft = float(np.median([x["ttft_s"] for x in r["long_prompts"]])) * 1e3
        print(
            f"{r['config']:>9}: short ITL p99 {s.get('p99_itl_ms'):.1f} ms, TTFT median {s.get('median_ttft_ms'):.0f} ms "
            f"p99 {s.get('p99_ttft_ms'):.0f} ms, output {s.get('output_throughput'):.1f} tok/s; "
            f"long prompts: {len(r['long_prompts'])}, TTFT median {long_ttft:.0f} ms"
        )
        if r.get("transfers") and args.layout.prefill_cp > 1:
            print(
                f"           (transfers of the prefill's rank 0: 1 / {args.layout.prefill_cp} of each prompt)"
            )
        for t in r.get("transfers", []):
            print(
                f"           transfer {t['tokens']} tok, {t['chunks']} chunks: {t['mb']:.1f} MB in {t['transfer_ms']:.1f} ms "
                f"({t['mb_per_s']:.0f} MB/s), {100 * t['overlap_fraction']:.0f} % overlapped the prefill"
            )
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
