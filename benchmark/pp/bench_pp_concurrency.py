"""Seed 003's scenario: throughput of chunked pipeline parallelism under concurrency.

16 requests of mixed length (prompt lengths drawn with a fixed seed, uniform in [1K, 8K] tokens;
32-64 output tokens each, EOS ignored) sent to a real server (`python -m sglang.launch_server`),
all at once or as a Poisson process (`--request-rate`). Configurations, one server after the other,
one torch thread per rank:
  pp1: one rank;  pp2: `--pp-size 2`;  tp2: `--tp-size 2`;
each with every `--dynamic-chunking` variant: `off` (fixed chunks of `--chunk`), `upstream`
(`--enable-dynamic-chunking`, smooth factor from SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR) and `auto`
(`--dynamic-chunking-mode auto`). The flag acts only with pp > 1: pp1 / tp2 with it on are the same
server as with it off (a repeat of the off row, a noise estimate).

Model: a dummy (random-weight) Llama of SmolLM2-135M's size (hidden 576, 30 layers, intermediate
1536, vocab 49152) with its 9 / 3 attention heads of 64 re-cut as 12 / 4 heads of 48, so that tp 2
divides them: the q / k / v / o projections, the KV bytes per token and the attention FLOPs are
SmolLM2's. Context 16K, bfloat16, radix cache off, no tokenizer (pre-tokenized random ids).

Reports per run: total throughput ((input + output tokens) / wall time from the first request sent
to the last one finished), output tokens/s, TTFT P50 / P99, request latency P50 (a markdown table on
stdout; `--out` JSON).

    python benchmark/pp/bench_pp_concurrency.py --out benchmark/pp/concurrency.json
    python benchmark/pp/bench_pp_concurrency.py --configs pp2 --dynamic-chunking off --num-requests 2 \
        --min-input 128 --max-input 256 --min-output 4 --max-output 8     # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pp_ttft import SMOLLM2_SHAPE, wait_for_quiet  # noqa: E402

SHAPE = {**SMOLLM2_SHAPE, "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 48}
CONFIGS = {"pp1": [], "pp2": ["--pp-size", "2"], "tp2": ["--tp-size", "2"]}
DYNAMIC = {
    "off": [],
    "upstream": ["--enable-dynamic-chunking"],
    "auto": ["--dynamic-chunking-mode", "auto"],
}
STARTUP_TIMEOUT_S = 900.0


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="pp1,pp2,tp2", help=f"comma-separated, of {sorted(CONFIGS)}")
    ap.add_argument(
        "--dynamic-chunking", default="off,upstream", help=f"comma-separated variants, of {sorted(DYNAMIC)}"
    )
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--min-input", type=int, default=1024)
    ap.add_argument("--max-input", type=int, default=8192)
    ap.add_argument("--min-output", type=int, default=32)
    ap.add_argument("--max-output", type=int, default=64)
    ap.add_argument(
        "--request-rate", type=float, default=float("inf"), help="Poisson requests/s; inf: all at once"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=1024, help="--chunked-prefill-size of every server")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--max-background-busy",
        type=float,
        default=0.1,
        help="before each run wait until the CPUs are at most this busy (shared machines)",
    )
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    args.configs = _choices(ap, "--configs", args.configs, CONFIGS)
    args.dynamic_chunking = _choices(ap, "--dynamic-chunking", args.dynamic_chunking, DYNAMIC)
    if not 1 <= args.min_input <= args.max_input or args.max_input + args.max_output > 16000:
        ap.error("--min-input / --max-input: need 1 <= min <= max and max + --max-output <= 16000")
    if not 1 <= args.min_output <= args.max_output:
        ap.error("--min-output / --max-output: need 1 <= min <= max")
    if args.num_requests < 1 or not args.request_rate > 0:
        ap.error("--num-requests must be >= 1 and --request-rate > 0")
    return args


def _choices(ap: argparse.ArgumentParser, flag: str, value: str, known: dict) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in known]
    if bad or not items:
        ap.error(f"{flag}: unknown {bad or 'empty list'}; expected some of {sorted(known)}")
    return items


def workload(args: argparse.Namespace) -> list[dict]:
    """The requests (same for every configuration): prompt ids, output length, send offset (s)."""
    rng = np.random.default_rng(args.seed)
    lens = rng.integers(args.min_input, args.max_input + 1, args.num_requests)
    outs = rng.integers(args.min_output, args.max_output + 1, args.num_requests)
    if np.isinf(args.request_rate):
        offsets = np.zeros(args.num_requests)
    else:
        offsets = np.concatenate(
            [[0.0], np.cumsum(rng.exponential(1 / args.request_rate, args.num_requests - 1))]
        )
    return [
        {"ids": rng.integers(3, SHAPE["vocab_size"], n).tolist(), "out": int(o), "at": float(t)}
        for n, o, t in zip(lens, outs, offsets)
    ]


# ---------------------------------------------------------------------------- the server
class Server:
    """One `sglang.launch_server` in its own process group (stopping it stops its ranks)."""

    def __init__(self, model_dir: str, name: str, extra: list[str], args: argparse.Namespace, port: int):
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        self.log_path = tempfile.NamedTemporaryFile(
            prefix=f"pp-conc-{name}-", suffix=".log", delete=False
        ).name
        cmd = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            *("--model-path", model_dir, "--load-format", "dummy", "--skip-tokenizer-init"),
            *("--port", str(port), "--num-threads", "1", "--dtype", args.dtype),
            *(
                "--chunked-prefill-size",
                str(args.chunk),
                "--context-length",
                str(SHAPE["max_position_embeddings"]),
            ),
            *(
                "--max-total-tokens",
                str(args.max_total_tokens),
                "--disable-radix-cache",
                "--log-level",
                "warning",
            ),
            *extra,
        ]
        print(f"[{name}] {' '.join(cmd)}  (log {self.log_path})", flush=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> float:
        """Seconds until /health_generate answers (a forward ran: the server is warm)."""
        start = time.monotonic()
        while time.monotonic() - start < STARTUP_TIMEOUT_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health_generate", timeout=120).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"{self.name} not ready in {STARTUP_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


# ---------------------------------------------------------------------------- the client
async def one_request(client: httpx.AsyncClient, url: str, req: dict, t0: float, bar: tqdm) -> dict:
    """Stream one request sent at t0 + req['at']; its TTFT, latency and token counts."""
    await asyncio.sleep(max(0.0, t0 + req["at"] - time.perf_counter()))
    body = {
        "input_ids": req["ids"],
        "stream": True,
        "sampling_params": {"max_new_tokens": req["out"], "temperature": 0, "ignore_eos": True},
    }
    sent, first, last = time.perf_counter(), None, None
    async with client.stream("POST", url + "/generate", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"/generate answered {r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                raise RuntimeError(f"/generate failed in-band: {chunk}")
            first = first or time.perf_counter()
            last = chunk
    done = time.perf_counter()
    bar.update(1)
    return {
        "input": len(req["ids"]),
        "output": last["meta_info"]["completion_tokens"],
        "sent": sent - t0,
        "ttft_s": first - sent,
        "latency_s": done - sent,
        "done": done - t0,
    }


async def send_all(url: str, reqs: list[dict], desc: str) -> list[dict]:
    limits = httpx.Limits(max_connections=len(reqs) + 4)
    async with httpx.AsyncClient(timeout=3600, limits=limits) as client:
        with tqdm(total=len(reqs), desc=desc, unit="req") as bar:
            t0 = time.perf_counter()
            return list(await asyncio.gather(*(one_request(client, url, r, t0, bar) for r in reqs)))


def summarize(rows: list[dict]) -> dict:
    wall = max(r["done"] for r in rows) - min(r["sent"] for r in rows)
    n_in, n_out = sum(r["input"] for r in rows), sum(r["output"] for r in rows)
    ttft = np.array([r["ttft_s"] for r in rows])
    return {
        "wall_s": wall,
        "input_tokens": n_in,
        "output_tokens": n_out,
        "total_tok_s": (n_in + n_out) / wall,
        "output_tok_s": n_out / wall,
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "latency_p50_s": statistics.median(r["latency_s"] for r in rows),
    }


def run_one(model_dir: str, config: str, dyn: str, reqs: list[dict], args: argparse.Namespace) -> dict:
    from sglang.srt.distributed.init import get_free_port

    name = f"{config}-{dyn}"
    server = Server(model_dir, name, CONFIGS[config] + DYNAMIC[dyn], args, get_free_port())
    try:
        startup = server.wait_ready()
        warm = {"ids": reqs[0]["ids"][: args.chunk + 64], "out": 4, "at": 0.0}
        asyncio.run(send_all(server.url, [warm], f"{name} warm-up"))
        background = wait_for_quiet(args.max_background_busy)
        rows = asyncio.run(send_all(server.url, reqs, name))
    finally:
        server.stop()
    time.sleep(2.0)  # let the cores settle before the next server
    return {
        "config": config,
        "dynamic_chunking": dyn,
        "startup_s": startup,
        "background_cpu_busy": background,
        "loadavg_end": os.getloadavg(),
        **summarize(rows),
        "requests": rows,
    }


def table(results: list[dict]) -> str:
    lines = [
        "| config | dynamic chunking | total tok/s | output tok/s | TTFT P50 (s) | TTFT P99 (s) "
        "| latency P50 (s) | wall (s) | CPU busy before |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        dyn = r["dynamic_chunking"] + (
            " (no-op at pp 1)" if r["config"] != "pp2" and r["dynamic_chunking"] != "off" else ""
        )
        lines.append(
            f"| {r['config']} | {dyn} | {r['total_tok_s']:.0f} | {r['output_tok_s']:.1f} | {r['ttft_p50_s']:.2f} "
            f"| {r['ttft_p99_s']:.2f} | {r['latency_p50_s']:.2f} | {r['wall_s']:.1f} "
            f"| {100 * r['background_cpu_busy']:.0f} % |"
        )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    reqs = workload(args)
    args.max_total_tokens = sum(len(r["ids"]) + r["out"] for r in reqs) + 2 * args.chunk + 1024
    model_dir = os.path.join(tempfile.gettempdir(), "sglang-bench-pp-conc-smollm2-size")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(SHAPE, f, indent=2)
    print(
        f"{len(reqs)} requests, {sum(len(r['ids']) for r in reqs)} prompt tokens "
        f"(lengths {sorted(len(r['ids']) for r in reqs)}), {sum(r['out'] for r in reqs)} output tokens, "
        f"request rate {args.request_rate}",
        flush=True,
    )
    plan = [(c, d) for c in args.configs for d in args.dynamic_chunking]
    results = [
        run_one(model_dir, c, d, reqs, args) for c, d in tqdm(plan, desc="configurations", unit="server")
    ]
    out = {
        "shape": SHAPE,
        "env": {k: v for k, v in os.environ.items() if k.startswith("SGLANG_DYNAMIC_CHUNKING")},
        "args": vars(args),
        "runs": results,
        "table": table(results),
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
    print(out["table"])


if __name__ == "__main__":
    main()
