"""Workload (c) through vLLM's offline API (runs inside vLLM's venv, not ours).

  VENV/bin/python vllm_offline.py --model HF_DIR --prompts prompts.json --result out.json [--enforce-eager]

`prompts.json`: {"prompts": [{"prompt_ids": [...], "output_len": n}, ...]}, written by run.py
from the same seeded dataset our engine gets. Greedy, ignore_eos; one warm-up generate, then
`--repeats` timed generates of the whole batch; writes the output tokens/s of each.
"""

import argparse
import json
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()

    from vllm import LLM, SamplingParams

    with open(args.prompts) as f:
        rows = json.load(f)["prompts"]
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=8192, enforce_eager=args.enforce_eager)
    prompts = [{"prompt_token_ids": r["prompt_ids"]} for r in rows]
    params = [SamplingParams(temperature=0.0, max_tokens=r["output_len"], ignore_eos=True) for r in rows]
    llm.generate(prompts[:1], params[:1], use_tqdm=False)
    runs = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        runs.append(sum(len(o.outputs[0].token_ids) for o in outs) / elapsed)
    with open(args.result, "w") as f:
        json.dump({"output_throughput": statistics.median(runs), "runs": runs}, f)
    print(f"vLLM offline: {statistics.median(runs):.1f} output tokens/s, runs {[round(r, 1) for r in runs]}")


if __name__ == "__main__":
    main()
