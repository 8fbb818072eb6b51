"""The client side of `step_breakdown.py`: the server, the workloads, the traces, the
HTTP-side timings and the server processes' CPU time."""

from __future__ import annotations

import json
import os
import random
import threading
import time

import requests

import servers
import step_trace


# ------------------------------------------------------------------------------ client side
def stream_generate(url: str, ids: list[int], max_new: int, stamps: list) -> None:
    """One streamed /generate; appends (time, completion tokens so far) per chunk to `stamps`."""
    body = {
        "input_ids": ids,
        "stream": True,
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True},
    }
    with requests.post(f"{url}/generate", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                meta = json.loads(line[6:]).get("meta_info", {})
                stamps.append((time.perf_counter(), meta.get("completion_tokens", len(stamps) + 1)))


def per_token_interval(stamps: list) -> float:
    """Seconds per generated token after the first, from one request's chunk stamps."""
    (t0, n0), (t1, n1) = stamps[0], stamps[-1]
    return (t1 - t0) / (n1 - n0) if n1 > n0 else float("nan")


def proc_cpu(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system) of each process."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return out


def process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def start_profile(url: str, out_dir: str, pid: str, steps, with_stack: bool) -> str:
    body = {"output_dir": out_dir, "with_stack": with_stack, "profile_id": pid}
    if steps is not None:
        body["num_steps"] = steps
    r = requests.post(f"{url}/start_profile", json=body, timeout=60)
    r.raise_for_status()
    return os.path.join(out_dir, f"{pid}-rank0.trace.json")


def wait_file(path: str, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path):
            time.sleep(1.0)  # written in one go at stop; let it finish
            with open(path) as f:
                return json.load(f)
        time.sleep(0.5)
    raise RuntimeError(f"no trace at {path} after {timeout_s:.0f} s")


def decode_pass(url: str, args, vocab: int, profile: dict | None, server_pid: int) -> dict:
    """`args.batch` concurrent streamed requests; with `profile` ({dir, id, stack}) a window of
    `args.steps` steps is traced once every request streams (all decoding)."""
    prompts = [[random.randint(100, vocab - 1) for _ in range(args.input_len)] for _ in range(args.batch)]
    stamps: list[list] = [[] for _ in prompts]
    threads = [
        threading.Thread(target=stream_generate, args=(url, ids, args.output_len, s))
        for ids, s in zip(prompts, stamps)
    ]
    tree = process_tree(server_pid)
    cpu0 = proc_cpu(tree)
    for t in threads:
        t.start()
    path = None
    if profile is not None:
        while any(len(s) < 2 for s in stamps):
            time.sleep(0.005)
        path = start_profile(url, profile["dir"], profile["id"], args.steps, profile["stack"])
    for t in threads:
        t.join()
    cpu1 = proc_cpu(tree)
    intervals = sorted(per_token_interval(s) for s in stamps)
    out = {
        "interval_s": intervals[len(intervals) // 2],
        "cpu_s": {p: cpu1[p] - cpu0.get(p, 0.0) for p in cpu1},
        "tokens": sum(s[-1][1] for s in stamps),
    }
    if path is not None:
        out["trace"] = wait_file(path)
    return out


def prefill_pass(url: str, args, vocab: int, profile: dict | None) -> dict:
    """One `args.prefill_len`-token prompt (new random tokens: no prefix-cache hit), 1 token out."""
    ids = [random.randint(100, vocab - 1) for _ in range(args.prefill_len)]
    path = None
    if profile is not None:  # stopped by hand: the step's result handling is traced too
        path = start_profile(url, profile["dir"], profile["id"], None, profile["stack"])
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True},
    }
    t = time.perf_counter()
    requests.post(f"{url}/generate", json=body, timeout=600).raise_for_status()
    out = {"ttft_s": time.perf_counter() - t}
    if path is not None:
        time.sleep(0.2)
        requests.post(f"{url}/stop_profile", timeout=60).raise_for_status()
        out["trace"] = wait_file(path)
    return out


def analyse(label_trace: dict, stack_trace: dict, steps: slice) -> dict:
    """Mean label ms and mean kernel ms per step over the traces' steps (`steps` picks which), and
    the layer GEMMs as the label trace sees them (aten ops, no Python tracer): a check that the
    two windows ran under the same conditions."""
    spans = step_trace.main_thread_spans(label_trace)
    rows = step_trace.label_times(spans, step_trace.step_windows(spans))[steps]
    plain_kernels = step_trace.model_kernel_times(spans)[steps]
    kernel_rows = step_trace.model_kernel_times(step_trace.main_thread_spans(stack_trace))[steps]
    pid = next(e["pid"] for e in label_trace["traceEvents"] if e.get("name") == step_trace.STEP_START)
    layer = step_trace.LAYER_GEMMS
    return {
        "labels": step_trace.mean_rows(rows),
        "kernels": step_trace.mean_rows(kernel_rows),
        "scheduler_pid": int(pid),
        "layer_gemms_label_trace": sum(step_trace.mean_rows(plain_kernels).get(k, 0.0) for k in layer),
        "steps": len(rows),
    }


def run_passes(args, info: dict, out_dir: str) -> dict:
    """Start the server, warm it up, run every pass; returns the raw measurements."""
    port = servers.free_port()
    extra = args.server_args.split() if args.server_args else []
    cmd = servers.ours_server_cmd(args.hf_dir, port, extra, dtype=args.dtype)
    server = servers.start_server("ours", cmd, port, os.path.join(out_dir, "server.log"))
    try:
        servers.wait_ready_ours(server)
        url, vocab, pid = server.url, info["shape"]["vocab"], server.proc.pid
        trace_dir = os.path.join(out_dir, "traces")
        print("warm-up", flush=True)
        decode_pass(url, args, vocab, None, pid)
        prefill_pass(url, args, vocab, None)
        raw: dict = {"load_before": os.getloadavg()}
        print("decode: unprofiled, label trace, stack trace", flush=True)
        raw["decode_plain"] = decode_pass(url, args, vocab, None, pid)
        raw["decode_label"] = decode_pass(
            url, args, vocab, {"dir": trace_dir, "id": "decode-label", "stack": False}, pid
        )
        raw["decode_stack"] = decode_pass(
            url, args, vocab, {"dir": trace_dir, "id": "decode-stack", "stack": True}, pid
        )
        print("prefill: unprofiled, label trace, stack trace", flush=True)
        raw["prefill_plain"] = prefill_pass(url, args, vocab, None)
        raw["prefill_label"] = prefill_pass(
            url, args, vocab, {"dir": trace_dir, "id": "prefill-label", "stack": False}
        )
        raw["prefill_stack"] = prefill_pass(
            url, args, vocab, {"dir": trace_dir, "id": "prefill-stack", "stack": True}
        )
        raw["load_after"] = os.getloadavg()
        raw["server_pid"] = pid
        return raw
    finally:
        servers.stop_server(server)
