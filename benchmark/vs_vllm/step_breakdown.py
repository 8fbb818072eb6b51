"""Where a served decode step and a served prefill go, part by part, next to the physical limits.

    .venv/bin/python benchmark/vs_vllm/step_breakdown.py            # this CPU's kind
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 SGLANG_CPU_ISA=avx2 \\
        .venv/bin/python benchmark/vs_vllm/step_breakdown.py         # as an AVX2-only CPU (emulated)

Starts the real server (SmolLM2-135M, the HF directory `run.py` converts, `--dtype auto` unless
`--dtype`), then for each workload -- decode: `--batch` concurrent streamed requests of
`--input-len` tokens, `--output-len` out, a window of `--steps` steady decode steps; prefill: one
`--prefill-len`-token prompt, 1 token out -- it runs three passes: unprofiled (the served
inter-token interval / TTFT and each server process's CPU time), a label trace (/start_profile,
`with_stack=False`: the `step_label` parts of each step, accurate) and a stack trace
(`with_stack=True`: each kernel under its Python frame; see `step_trace.py`). Before the server
starts it measures the memory read bandwidth and torch.mm's GEMM rate with `--threads` threads.
Writes `breakdown.json` and `breakdown.md` into `--out-dir` (default a fresh `.work/steps-*`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import servers
import step_client
import step_limits
import step_report
import step_trace

HERE = os.path.dirname(os.path.abspath(__file__))
OMP_ENV = (
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "OMP_NUM_THREADS",
)  # recorded: they decide behaviour under load


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-dir", default=os.path.join(HERE, ".work", "smollm2-hf"))
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=16, help="decode steps in each profiled window")
    p.add_argument("--prefill-len", type=int, default=2048)
    p.add_argument("--threads", type=int, default=2, help="for the bandwidth / GEMM-rate measurements")
    p.add_argument("--out-dir", default=None)
    p.add_argument("--server-args", default="", help="extra launch_server flags")
    p.add_argument(
        "--reanalyse", default=None, help="a run's directory: recompute its tables from raw.json + traces"
    )
    return p.parse_args(argv)


def ms_per_step(cpu_s: dict, pids: set, steps: int) -> float:
    return 1e3 * sum(v for p, v in cpu_s.items() if p in pids) / max(steps, 1)


def summarise_traces(label_trace: dict, stack_trace: dict, steps: slice) -> dict:
    """Both traces of one workload: the rows per step and what went into them."""
    got = step_client.analyse(label_trace, stack_trace, steps)
    labels = got["labels"]
    kernels, ratio = step_report.calibrate(got["kernels"], got["layer_gemms_label_trace"])
    return {
        "labels_ms": labels,
        "kernels_ms": kernels,
        "rows": step_report.breakdown_rows(labels, kernels),
        "step_ms": labels["step"],
        "gemm_ms": step_report.gemm_sum(kernels),
        "check_layer_gemms_ms": {
            "label_trace": got["layer_gemms_label_trace"],
            "stack_trace": step_report.layer_gemm_sum(got["kernels"]),
            "ratio_applied": ratio,
            "fit_applied": step_report.kernel_fit(labels, kernels),
        },
        "kernels_ms_uncalibrated": got["kernels"],
        "steps_traced": got["steps"],
        "scheduler_pid": got["scheduler_pid"],
    }


def summarise_decode(args, shape, mode: str, bw: dict, raw: dict) -> dict:
    out = summarise_traces(raw["decode_label"]["trace"], raw["decode_stack"]["trace"], slice(0, -1))
    sched_pid = out["scheduler_pid"]
    plain = raw["decode_plain"]
    cpu, main_pid = plain["cpu_s"], raw["server_pid"]
    others = set(cpu) - {main_pid, sched_pid}
    eb = step_trace.weight_elem_bytes(mode, args.batch)
    kv_eb = 4 if mode.startswith("float32") else 2
    need = step_trace.decode_bytes(shape, eb, args.batch, args.input_len + args.output_len // 2, kv_eb)
    read = bw["read_bytes_per_s"]
    return out | {
        "served_interval_ms": plain["interval_s"] * 1e3,
        "cpu_ms_per_step": {
            "http_tokenizer_manager": ms_per_step(cpu, {main_pid}, args.output_len),
            "scheduler": ms_per_step(cpu, {sched_pid}, args.output_len),
            "detokenizer_and_helpers": ms_per_step(cpu, others, args.output_len),
        },
        "bytes": need,
        "weight_elem_bytes": eb,
        "limit_ms": {
            "weights": step_trace.limit_ms(need["weight_bytes"], read),
            "weights_and_kv": step_trace.limit_ms(need["total_bytes"], read),
        },
    }


def summarise_prefill(args, shape, mode: str, rates: dict, raw: dict) -> dict:
    out = summarise_traces(raw["prefill_label"]["trace"], raw["prefill_stack"]["trace"], slice(0, None))
    flops = step_trace.prefill_flops(shape, args.prefill_len)
    dtype = step_trace.gemm_dtype(mode, args.prefill_len)
    rate = rates[dtype]["flops_per_s"]
    return out | {
        "served_ttft_ms": raw["prefill_plain"]["ttft_s"] * 1e3,
        "flops": flops,
        "gemm_dtype": dtype,
        "limit_ms": {
            "gemms": step_trace.limit_ms(flops["gemm_flops"], rate),
            "attention_at_gemm_rate": step_trace.limit_ms(flops["attention_flops"], rate),
        },
    }


def check_line(part: dict) -> tuple[str, str]:
    c = part["check_layer_gemms_ms"]
    return (
        f"layer GEMMs, label trace vs stack trace ({part['steps_traced']} steps): the forward's kernel "
        "rows are the stack trace's times × their ratio",
        f"{c['label_trace']:.2f} vs {c['stack_trace']:.2f} ms (× {c['ratio_applied']:.3f}"
        + (f"; then × {c['fit_applied']:.3f} to fit the model label)" if c["fit_applied"] < 1.0 else ")"),
    )


def render(result: dict) -> str:
    d, p, m = result["decode"], result["prefill"], result["machine"]
    gb = 1e9
    dec_extra = [
        ("served inter-token interval (unprofiled, median)", f"{d['served_interval_ms']:.2f} ms"),
        (
            "served interval minus the step: HTTP / tokenizer manager / detokenizer / ZMQ, profiler cost",
            f"{d['served_interval_ms'] - d['step_ms']:.2f} ms",
        ),
        *[(f"CPU per step, {k} (unprofiled)", f"{v:.2f} ms") for k, v in d["cpu_ms_per_step"].items()],
        (
            "weights read per step / at measured read bandwidth",
            f"{d['bytes']['weight_bytes'] / 1e6:.0f} MB / {d['limit_ms']['weights']:.2f} ms",
        ),
        (
            "+ KV read per step / weights + KV limit",
            f"{d['bytes']['kv_bytes'] / 1e6:.0f} MB / {d['limit_ms']['weights_and_kv']:.2f} ms",
        ),
        ("all GEMMs vs their weight-read limit", f"{d['gemm_ms']:.2f} vs {d['limit_ms']['weights']:.2f} ms"),
        check_line(d),
    ]
    pre_extra = [
        ("served TTFT (unprofiled, /generate with token ids)", f"{p['served_ttft_ms']:.1f} ms"),
        (
            "GEMM FLOPs / at measured torch.mm rate "
            f"({p['gemm_dtype']}, {m['gemm_rates'][p['gemm_dtype']]['flops_per_s'] / gb:.0f} GFLOP/s)",
            f"{p['flops']['gemm_flops'] / gb:.0f} GFLOP / {p['limit_ms']['gemms']:.1f} ms",
        ),
        (
            "attention FLOPs / at the same rate",
            f"{p['flops']['attention_flops'] / gb:.0f} GFLOP / {p['limit_ms']['attention_at_gemm_rate']:.1f} ms",
        ),
        ("all GEMMs vs their FLOP limit", f"{p['gemm_ms']:.1f} vs {p['limit_ms']['gemms']:.1f} ms"),
        check_line(p),
    ]
    a = result["args"]
    head = (
        f"CPU: {result['cpu']['model']}, runs as `{result['cpu']['kind']}`"
        f"{' (emulated: ' + str(result['cpu']['emulation_env']) + ')' if result['cpu']['emulated'] else ''}, "
        f"dtype `{result['dtype_mode']}`{', ' + str(result['omp_env']) if result['omp_env'] else ''}; load average before / after: "
        f"{result['load_before'][0]:.2f} / {result['load_after'][0]:.2f}; read bandwidth "
        f"{m['bandwidth']['read_bytes_per_s'] / gb:.1f} GB/s (sum), copy {m['bandwidth']['copy_bytes_per_s'] / gb:.1f}"
        f" GB/s; torch.mm {m['gemm_rates']['float32']['flops_per_s'] / gb:.0f} GFLOP/s float32, "
        f"{m['gemm_rates']['bfloat16']['flops_per_s'] / gb:.0f} bfloat16 ({a['threads']} threads)\n\n"
    )
    return (
        head
        + step_report.markdown_table(
            f"decode, batch {a['batch']}, {a['input_len']} in / {a['output_len']} out, per step",
            d["rows"],
            d["step_ms"],
            dec_extra,
        )
        + "\n"
        + step_report.markdown_table(
            f"prefill, one {a['prefill_len']}-token prompt", p["rows"], p["step_ms"], pre_extra
        )
    )


def measure(args, shape, out_dir: str) -> tuple[dict, dict, str]:
    """The machine's rates, then the server passes; saves `raw.json` (all but the traces)."""
    cpu = servers.cpu_info()
    mode = cpu["ours_auto_dtype"] if args.dtype == "auto" else args.dtype
    print(
        f"CPU kind {cpu['kind']} (emulated: {cpu['emulated']}), dtype {mode}; measuring the limits",
        flush=True,
    )
    machine = {
        "bandwidth": step_limits.read_bandwidth(args.threads),
        "gemm_rates": step_limits.gemm_rates(shape, args.prefill_len, args.threads),
    }
    raw = step_client.run_passes(args, {"shape": dataclasses.asdict(shape)}, out_dir)
    raw.update(
        cpu=cpu,
        dtype_mode=mode,
        machine=machine,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        omp_env={k: os.environ[k] for k in OMP_ENV if k in os.environ},
        args=vars(args),
    )
    saved = {
        k: {kk: vv for kk, vv in v.items() if kk != "trace"} if isinstance(v, dict) else v
        for k, v in raw.items()
    }
    with open(os.path.join(out_dir, "raw.json"), "w") as f:
        json.dump(saved, f, indent=1, default=str)
    return raw, machine, mode


def load_raw(out_dir: str) -> dict:
    """`raw.json` of an earlier run with its traces (`--reanalyse`)."""
    with open(os.path.join(out_dir, "raw.json")) as f:
        raw = json.load(f)
    for part in ("decode_label", "decode_stack", "prefill_label", "prefill_stack"):
        with open(os.path.join(out_dir, "traces", f"{part.replace('_', '-')}-rank0.trace.json")) as f:
            raw[part]["trace"] = json.load(f)
    for part in ("decode_plain", "decode_label", "decode_stack"):
        raw[part]["cpu_s"] = {int(k): v for k, v in raw[part]["cpu_s"].items()}
    return raw


def main(args) -> int:
    out_dir = (
        args.reanalyse or args.out_dir or os.path.join(HERE, ".work", time.strftime("steps-%Y%m%d-%H%M%S"))
    )
    os.makedirs(out_dir, exist_ok=True)
    if not os.path.exists(os.path.join(args.hf_dir, "config.json")):
        from sglang.srt.model_loader.default_model import find_default_model

        servers.ensure_hf_dir(find_default_model(), args.hf_dir)
    with open(os.path.join(args.hf_dir, "config.json")) as f:
        shape = step_trace.LlamaShape.from_config(json.load(f))
    if args.reanalyse:
        raw = load_raw(out_dir)
        for key in ("batch", "input_len", "output_len", "prefill_len", "threads", "dtype"):
            setattr(args, key, raw["args"][key])
        machine, mode = raw["machine"], raw["dtype_mode"]
    else:
        raw, machine, mode = measure(args, shape, out_dir)
    result = {
        "date": raw["date"],
        "args": raw.get("args", vars(args)),
        "cpu": raw["cpu"],
        "dtype_mode": mode,
        "omp_env": raw["omp_env"],
        "machine": machine,
        "load_before": raw["load_before"],
        "load_after": raw["load_after"],
        "decode": summarise_decode(args, shape, mode, machine["bandwidth"], raw),
        "prefill": summarise_prefill(args, shape, mode, machine["gemm_rates"], raw),
    }
    table = render(result)
    with open(os.path.join(out_dir, "breakdown.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(os.path.join(out_dir, "breakdown.md"), "w") as f:
        f.write(table)
    print(table)
    print(f"written: {out_dir}/breakdown.md, breakdown.json (traces in {out_dir}/traces)")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
