"""Structured outputs overhead (issue 29): batch-8 decode with a JSON-schema constraint vs
unconstrained, same prompts, in-process scheduler (the default model); and grammar compile time,
cold and cached.

Reports per mode the inter-token latency of decode steps (median, P99: one decode step of the
batch = one token of each request) and output tokens/s over those steps; then the compile time of
a fresh schema (cold, the compile thread's work) and of a cached one (the scheduler's lookup).

  python benchmark/structured/bench_constrained.py [--dtype float32] [--new-tokens 64] [--num-threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from sglang.srt.constrained.grammar_spec import GrammarSpec
from sglang.srt.constrained.xgrammar_backend import XGrammarBackend
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler.scheduler import Scheduler
from sglang.srt.model_loader.default_model import find_default_model
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_transformers_utils import get_tokenizer

BATCH = 8
SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}}}


def decode_itls(
    sched: Scheduler, prompts: list[list[int]], new_tokens: int, constrained: bool
) -> list[float]:
    """Seconds of each decode-only step while the batch of `prompts` runs (after one warm prefill)."""
    for i, ids in enumerate(prompts):
        extra = {"json_schema": json.dumps(SCHEMA)} if constrained else {}
        params = SamplingParams(
            max_new_tokens=new_tokens, temperature=0.0, ignore_eos=not constrained, **extra
        )
        sched.handle_message(TokenizedGenerateReqInput(f"{constrained}-{i}", None, ids, params))
    itls = []
    while sched.has_work:
        decode = bool(sched.running) and not sched.waiting and all(r.output_ids for r in sched.running)
        t = time.perf_counter()
        sched.step()
        if decode and len(sched.running) == len(prompts):
            itls.append(time.perf_counter() - t)
    sched.collect_outputs()
    return itls


def report(name: str, itls: list[float]) -> None:
    p99 = sorted(itls)[max(0, int(len(itls) * 0.99) - 1)]
    med = statistics.median(itls)
    print(
        f"{name:13s} ITL median {med * 1e3:7.2f} ms  P99 {p99 * 1e3:7.2f} ms  {BATCH / med:7.1f} tok/s  ({len(itls)} steps)"
    )


def compile_times(tokenizer, vocab: int, eos: list[int]) -> None:
    backend = XGrammarBackend(tokenizer, vocab, eos)
    spec = GrammarSpec("json_schema", json.dumps({**SCHEMA, "title": str(time.time())}))
    t = time.perf_counter()
    compiled = backend.compile(spec)
    cold = time.perf_counter() - t
    backend.store(spec, compiled)
    t = time.perf_counter()
    for _ in range(1000):
        backend.cached(spec)
    cached = (time.perf_counter() - t) / 1000
    print(f"compile       cold {cold * 1e3:.2f} ms  cached {cached * 1e6:.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--num-threads", type=int, default=1)
    args = ap.parse_args()
    path = find_default_model()
    tokenizer = get_tokenizer(path)
    server_args = ServerArgs(
        model_path=path, dtype=args.dtype, num_threads=args.num_threads, disable_radix_cache=True
    )
    server_args.validate()
    sched = Scheduler(server_args, tokenizer=tokenizer)
    base = "Write a JSON object listing things you can find in a kitchen"
    prompts = [tokenizer.encode(f"{base} (list {i}):") for i in range(BATCH)]
    decode_itls(sched, prompts[:1], 4, True)  # warm-up, builds the vocabulary tables
    report("unconstrained", decode_itls(sched, prompts, args.new_tokens, False))
    report("json_schema", decode_itls(sched, prompts, args.new_tokens, True))
    compile_times(tokenizer, sched.model_config.vocab_size, sorted(sched.eos_token_ids))


if __name__ == "__main__":
    main()
