"""Jump-forward (`--enable-jump-forward`) on vs off: a JSON schema with long fixed keys, a batch of
requests through the in-process scheduler (the default model), greedy, to the grammar's end.

Reports per mode the forward steps, output tokens, wall time of the whole batch, the time per
output token of a request (its latency / its tokens, median: the ITL a client sees) and the step
time (median, P99).

  python benchmark/structured/bench_jump_forward.py [--batch 8] [--num-threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler.scheduler import Scheduler
from sglang.srt.model_loader.default_model import find_default_model
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.long_key_schema import SCHEMA_TEXT

TOPICS = ["a customer", "a bank client", "a shop visitor", "a gym member", "a hotel guest", "a patient"]


def run(sched: Scheduler, prompts: list[list[int]], tag: str) -> dict:
    params = SamplingParams(max_new_tokens=128, temperature=0.0, json_schema=SCHEMA_TEXT)
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        sched.handle_message(TokenizedGenerateReqInput(f"{tag}-{i}", None, ids, params))
    steps0, step_times, done, tokens = sched.forward_ct, [], {}, {}
    while sched.has_work:
        t = time.perf_counter()
        out = sched.step()
        step_times.append(time.perf_counter() - t)
        for i, rid in enumerate(out.rids if out is not None else []):
            tokens[rid] = tokens.get(rid, 0) + len(out.new_output_ids[i])
            if out.finished_reasons[i] is not None:
                done[rid] = time.perf_counter() - start
    return {
        "steps": sched.forward_ct - steps0,
        "tokens": sum(tokens.values()),
        "wall": time.perf_counter() - start,
        "per_token": statistics.median(done[r] / tokens[r] for r in done),
        "step_med": statistics.median(step_times),
        "step_p99": sorted(step_times)[max(0, int(len(step_times) * 0.99) - 1)],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--num-threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    model = find_default_model()
    tokenizer = get_tokenizer(model)
    prompts = []
    for i in range(args.batch):
        messages = [{"role": "user", "content": f"Describe {TOPICS[i % len(TOPICS)]} #{i} as JSON."}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompts.append(tokenizer.encode(text))
    for jump in (False, True):
        server_args = ServerArgs(
            model_path=model, dtype=args.dtype, num_threads=args.num_threads, enable_jump_forward=jump
        )
        server_args.validate()
        sched = Scheduler(server_args, tokenizer=tokenizer)
        run(sched, prompts[:1], "warm")  # compile the grammar, warm the kernels
        r = run(sched, prompts, "run")
        print(
            f"jump-forward {'on ' if jump else 'off'}  steps {r['steps']:4d}  output tokens {r['tokens']:4d}  "
            f"batch wall {r['wall']:6.2f} s  per output token {r['per_token'] * 1e3:6.1f} ms  "
            f"step median {r['step_med'] * 1e3:6.1f} ms  P99 {r['step_p99'] * 1e3:6.1f} ms"
        )
        sched.grammar.close()


if __name__ == "__main__":
    main()
