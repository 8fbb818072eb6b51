"""Latency of one static batch without a server (SGLang's `python -m sglang.bench_one_batch`).

  python -m sglang.bench_one_batch --model-path MODEL --batch-size 1 16 --input-len 256 --output-len 32

For each (batch size, input length, output length) it prefills `batch` random prompts in one
forward, then decodes `output_len - 1` steps, and prints SGLang's lines: prefill latency and
throughput (batch * input_len / latency), the first decode steps, the median decode latency and
throughput (batch / latency), and the total. A warm-up run comes first.

- tp = pp = cp = 1: a `ModelRunner` is built in this process and driven directly (the same KV
  cache manager and worker-batch path the scheduler uses; no scheduler, no IPC).
- Any parallel size > 1: the ranks run in a real `sgl.Engine` and only what is visible from
  outside is measured: the batch is streamed and step k ends when every request has received its
  k-th token (prefill = step 1). These times include the engine's IPC and detokenization, and the
  scheduler may chunk a large prefill (`--chunked-prefill-size`).

`--profile` wraps the first measured run in torch.profiler and prints the top operators
(`--profile-filename-prefix` also writes a Chrome trace).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import statistics
import sys
import time
from contextlib import nullcontext
from typing import Any, Optional

import numpy as np

from sglang.srt.server_args import ServerArgs

PRINTED_DECODE_STEPS = 5


def parse_args(argv: Optional[list[str]] = None) -> tuple[argparse.Namespace, ServerArgs]:
    p = argparse.ArgumentParser(prog="python -m sglang.bench_one_batch", description=__doc__.splitlines()[0])
    ServerArgs.add_cli_args(p)
    p.add_argument("--run-name", default="before")
    p.add_argument("--batch-size", type=int, nargs="+", default=[1])
    p.add_argument("--input-len", type=int, nargs="+", default=[1024])
    p.add_argument("--output-len", type=int, nargs="+", default=[16])
    p.add_argument("--seed", type=int, default=1, help="seed of the random prompts")
    p.add_argument("--result-filename", default=None, help="append one JSON line per configuration")
    p.add_argument("--profile", action="store_true", help="torch.profiler over the first measured run")
    p.add_argument("--profile-filename-prefix", default=None, help="write the profile as a Chrome trace")
    args = p.parse_args(argv)
    if min(args.batch_size + args.input_len + args.output_len) < 1:
        p.error("--batch-size, --input-len and --output-len must be >= 1")
    server_args = ServerArgs.from_cli_args(args)
    need = max(args.batch_size) * (max(args.input_len) + max(args.output_len))
    changes: dict[str, Any] = {}
    if server_args.max_total_tokens is None:
        changes["max_total_tokens"] = max(
            need + server_args.page_size * max(args.batch_size), 2 * server_args.page_size
        )
    if server_args.max_running_requests is None or server_args.max_running_requests < max(args.batch_size):
        changes["max_running_requests"] = max(args.batch_size)
    server_args = server_args.replace(**changes)
    server_args.validate()
    from sglang.srt.configs.startup_checks import check_server_args_against_model

    check_server_args_against_model(server_args)  # as a server's start-up does
    return args, server_args


def is_parallel(server_args: ServerArgs) -> bool:
    return max(server_args.tp_size, server_args.pp_size, server_args.cp_size, server_args.dp_size) > 1


# ---------------------------------------------------------------------------- tp = 1: ModelRunner
class RunnerBench:
    """Drives one ModelRunner with static batches (prefill once, then decode steps)."""

    def __init__(self, server_args: ServerArgs):
        from sglang.srt.distributed.parallel_state import ParallelGroups
        from sglang.srt.managers.scheduler.cache_manager import KVCacheManager
        from sglang.srt.mem_cache.radix_cache import RadixCache
        from sglang.srt.model_executor.model_runner import ModelRunner

        self.runner = ModelRunner(server_args, ParallelGroups.single())
        tree = RadixCache(self.runner.allocator, server_args.page_size, disable=True)
        self.cache = KVCacheManager(self.runner.req_to_token_pool, self.runner.allocator, tree)
        self.vocab_size = self.runner.model_config.vocab_size
        self.context_len = self.runner.model_config.context_len

    def _step(self, items: list) -> list[int]:
        from sglang.srt.managers.scheduler.schedule_batch import ScheduleBatch

        batch = ScheduleBatch(items)
        loc = self.cache.alloc_for_step(items)
        if loc is None:
            raise RuntimeError("the KV pool is too small for this batch (raise --max-total-tokens)")
        worker_batch = batch.to_worker_batch(loc)
        for item in items:
            item.req.kv_len = item.start + item.num_tokens
        return self.runner.forward(worker_batch).next_token_ids

    def run(self, prompts: list[list[int]], output_len: int) -> tuple[float, list[float]]:
        """(prefill latency, decode step latencies) of one static batch, in seconds."""
        from sglang.srt.managers.scheduler.schedule_batch import Req, ScheduledReq
        from sglang.srt.sampling.sampling_params import SamplingParams

        reqs = []
        for i, ids in enumerate(prompts):
            params = SamplingParams(max_new_tokens=output_len, temperature=0.0, ignore_eos=True).normalize()
            reqs.append(Req(f"bench-{i}", ids, params))
        try:
            for req in reqs:
                if not self.cache.admit(req):
                    raise RuntimeError("no free request slot (raise --max-running-requests)")
            start = time.perf_counter()
            tokens = self._step([ScheduledReq(r, 0, len(r.origin_input_ids)) for r in reqs])
            prefill = time.perf_counter() - start
            decodes = []
            for _ in range(output_len - 1):
                for req, token in zip(reqs, tokens):
                    req.output_ids.append(token)
                start = time.perf_counter()
                tokens = self._step([ScheduledReq(r, r.kv_len, 1) for r in reqs])
                decodes.append(time.perf_counter() - start)
            return prefill, decodes
        finally:
            for req in reqs:
                self.cache.release(req)


# ---------------------------------------------------------------------------- parallel: Engine
class EngineBench:
    """Drives a real sgl.Engine (parallel ranks); measures from outside only."""

    def __init__(self, server_args: ServerArgs):
        from sglang.srt.entrypoints.engine import Engine

        self.engine = Engine(**dataclasses.asdict(server_args))
        self.vocab_size = self.engine.scheduler_info.vocab_size
        self.context_len = self.engine.scheduler_info.context_len

    def run(self, prompts: list[list[int]], output_len: int) -> tuple[float, list[float]]:
        """Stream the batch; step k ends when every request has received its k-th token."""
        params = {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True}
        self.engine.flush_cache()
        arrivals: list[list[float]] = [[] for _ in range(output_len + 1)]
        received = [0] * len(prompts)
        start = time.perf_counter()
        for chunk in self.engine.generate(input_ids=prompts, sampling_params=params, stream=True):
            now = time.perf_counter()
            i = chunk.get("index", 0)
            n = min(chunk["meta_info"]["completion_tokens"], output_len)
            for k in range(received[i] + 1, n + 1):
                arrivals[k].append(now)
            received[i] = max(received[i], n)
        ends = [start] + [max(times) for times in arrivals[1:] if len(times) == len(prompts)]
        steps = [b - a for a, b in zip(ends, ends[1:])]
        if not steps:
            raise RuntimeError("the engine returned no tokens")
        return steps[0], steps[1:]

    def shutdown(self) -> None:
        self.engine.shutdown()


# ---------------------------------------------------------------------------- reporting
def measure(
    bench: Any, batch: int, input_len: int, output_len: int, rng: np.random.Generator, verbose: bool
) -> dict:
    if input_len + output_len > bench.context_len:
        raise ValueError(
            f"input_len + output_len ({input_len + output_len}) exceeds the context length {bench.context_len}"
        )
    high = min(bench.vocab_size, 10000)
    prompts = [[int(t) for t in rng.integers(0, high, size=input_len)] for _ in range(batch)]
    prefill, decodes = bench.run(prompts, output_len)
    total = prefill + sum(decodes)
    result: dict[str, Any] = {
        "batch_size": batch,
        "input_len": input_len,
        "output_len": output_len,
        "prefill_latency": prefill,
        "prefill_throughput": batch * input_len / prefill,
        "total_latency": total,
        "overall_throughput": batch * (input_len + output_len) / total,
    }
    if verbose:
        print(f"Prefill. latency: {prefill:6.5f} s, throughput: {result['prefill_throughput']:9.2f} token/s")
    if decodes:
        if verbose:
            for i, lat in enumerate(decodes[:PRINTED_DECODE_STEPS]):
                print(
                    f"Decode {i}. Batch size: {batch}, latency: {lat:6.5f} s, throughput: {batch / lat:9.2f} token/s"
                )
        med = statistics.median(decodes)
        result["median_decode_latency"] = med
        result["median_decode_throughput"] = batch / med
        if verbose:
            print(f"Decode.  median latency: {med:6.5f} s, median throughput: {batch / med:9.2f} token/s")
    if verbose:
        print(f"Total. latency: {total:6.3f} s, throughput: {result['overall_throughput']:9.2f} token/s")
    return result


def _profiler(args: argparse.Namespace) -> Any:
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities, record_shapes=True)


def run(args: argparse.Namespace, server_args: ServerArgs) -> list[dict]:
    logging.basicConfig(level=getattr(logging, server_args.log_level.upper(), logging.INFO))
    parallel = is_parallel(server_args)
    bench: Any = EngineBench(server_args) if parallel else RunnerBench(server_args)
    mode = "engine" if parallel else "model_runner"
    rng = np.random.default_rng(args.seed)
    results = []
    if parallel:
        print(
            "Mode: sgl.Engine (a parallel size > 1): times are measured from outside the engine, IPC included"
        )
    try:
        print("Warmup ...")
        measure(bench, args.batch_size[0], args.input_len[0], min(args.output_len[0], 4), rng, verbose=True)
        profiled = False
        for batch, input_len, output_len in itertools.product(
            args.batch_size, args.input_len, args.output_len
        ):
            print(
                f"Benchmark ... (batch size {batch}, input len {input_len}, output len {output_len}, {mode})"
            )
            prof = _profiler(args) if args.profile and not profiled else nullcontext()
            with prof:
                result = measure(bench, batch, input_len, output_len, rng, verbose=True)
            if args.profile and not profiled:
                profiled = True
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
                if args.profile_filename_prefix:
                    path = (
                        f"{args.profile_filename_prefix}-bs{batch}-in{input_len}-out{output_len}.trace.json"
                    )
                    prof.export_chrome_trace(path)
                    print(f"profile written to {path}")
            result.update(run_name=args.run_name, mode=mode)
            results.append(result)
            if args.result_filename:
                with open(args.result_filename, "a", encoding="utf-8") as f:
                    f.write(json.dumps(result) + "\n")
    finally:
        if parallel:
            bench.shutdown()
    return results


def main(argv: Optional[list[str]] = None) -> int:
    args, server_args = parse_args(argv)
    run(args, server_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
