"""Online serving benchmark against a running server (SGLang's `python -m sglang.bench_serving`).

Examples:
  python -m sglang.bench_serving --backend sglang --dataset-name random --num-prompts 64 \
      --random-input-len 256 --random-output-len 64 --random-range-ratio 1.0 --max-concurrency 16
  python -m sglang.bench_serving --backend openai --base-url http://127.0.0.1:8000 \
      --dataset-name sharegpt --dataset-path ShareGPT_V3.json --request-rate 4

Backends: `sglang` (native /generate), `openai` (/v1/completions), `openai-chat`
(/v1/chat/completions); the OpenAI ones drive any compatible server, vLLM's included. Requests
arrive as a Poisson process of `--request-rate` per second (inf: all at once), at most
`--max-concurrency` in flight. Prints SGLang's "Serving Benchmark Result" block and appends one
JSON line per run to `--output-file`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any, AsyncIterator, Optional

import numpy as np
import requests

from sglang.benchmark.backends import (
    ENDPOINTS,
    REQUEST_FUNCS,
    RequestFuncInput,
    RequestFuncOutput,
    new_session,
    resolve_backend,
)
from sglang.benchmark.datasets import DatasetRow, add_dataset_args, get_dataset
from sglang.benchmark.metrics import calculate_metrics, format_summary, metrics_record


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m sglang.bench_serving", description="Online serving benchmark."
    )
    p.add_argument(
        "--backend", default="sglang", help="sglang | openai | openai-chat (aliases: vllm, sglang-oai)"
    )
    p.add_argument("--base-url", default=None, help="server URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model", default=None, help="model name sent to OpenAI backends (default: the server's)")
    p.add_argument(
        "--tokenizer", default=None, help="tokenizer path (default: --model or the server's model path)"
    )
    p.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (or $OPENAI_API_KEY)"
    )
    add_dataset_args(p)
    p.add_argument(
        "--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf = all at once"
    )
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    p.add_argument(
        "--warmup-requests", type=int, default=1, help="requests sent (and discarded) before the run"
    )
    p.add_argument("--disable-ignore-eos", action="store_true", help="let requests stop at EOS")
    p.add_argument("--extra-request-body", default=None, help="JSON merged into every request body")
    p.add_argument(
        "--flush-cache", action="store_true", help="POST /flush_cache before the run (sglang servers)"
    )
    p.add_argument("--output-file", default=None, help="append one JSON line with the results")
    p.add_argument(
        "--output-details", action="store_true", help="include per-request values in the JSON line"
    )
    p.add_argument("--disable-tqdm", action="store_true")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------- server discovery
def base_url(args: argparse.Namespace) -> str:
    return (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")


def auth_headers(args: argparse.Namespace) -> dict:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def server_model(url: str, headers: dict) -> tuple[Optional[str], Optional[str]]:
    """(served model name, model path) from GET /v1/models; (None, None) when unavailable."""
    try:
        r = requests.get(f"{url}/v1/models", headers=headers, timeout=30)
        r.raise_for_status()
        card = r.json()["data"][0]
        return card.get("id"), card.get("root") or card.get("id")
    except Exception:  # noqa: BLE001 - discovery is best effort
        return None, None


def load_tokenizer(path: str) -> Any:
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # "sequence longer than model_max_length" is expected here
    except ImportError:
        pass
    return get_tokenizer(path)


# ---------------------------------------------------------------------------- the run
async def arrivals(
    rows: list[DatasetRow], rate: float, rng: np.random.Generator
) -> AsyncIterator[DatasetRow]:
    """Yield rows at Poisson arrival times of `rate` per second (all at once when inf)."""
    for row in rows:
        yield row
        if rate != float("inf"):
            await asyncio.sleep(float(rng.exponential(1.0 / rate)))


async def benchmark(
    args: argparse.Namespace, backend: str, api_url: str, model: str, rows: list[DatasetRow], headers: dict
) -> tuple[list[RequestFuncOutput], float]:
    """Warm up, then send every row; returns the outputs and the duration of the timed part."""
    request_func = REQUEST_FUNCS[backend]
    extra = json.loads(args.extra_request_body) if args.extra_request_body else {}

    def make_input(row: DatasetRow) -> RequestFuncInput:
        return RequestFuncInput(
            prompt=row.prompt,
            api_url=api_url,
            prompt_len=row.prompt_len,
            output_len=row.output_len,
            model=model,
            ignore_eos=not args.disable_ignore_eos,
            extra_request_body=extra,
            headers=headers,
        )

    async with new_session() as session:
        for i in range(args.warmup_requests):
            warm = await request_func(make_input(rows[i % len(rows)]), session)
            if not warm.success:
                raise RuntimeError(f"warm-up request failed: {warm.error}")
        semaphore = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
        pbar = None
        if not args.disable_tqdm:
            from tqdm.asyncio import tqdm

            pbar = tqdm(total=len(rows))

        async def run_one(row: DatasetRow) -> RequestFuncOutput:
            if semaphore is None:
                out = await request_func(make_input(row), session)
            else:
                async with semaphore:
                    out = await request_func(make_input(row), session)
            if pbar is not None:
                pbar.update(1)
            return out

        rng = np.random.default_rng(args.seed)
        start = time.perf_counter()
        tasks = [asyncio.create_task(run_one(row)) async for row in arrivals(rows, args.request_rate, rng)]
        outputs = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        if pbar is not None:
            pbar.close()
    return list(outputs), duration


def run_benchmark(args: argparse.Namespace) -> dict:
    """Run one benchmark as configured by `args` (see `parse_args`); returns the JSON record."""
    backend = resolve_backend(args.backend)
    url = base_url(args)
    headers = auth_headers(args)
    served, model_path = server_model(url, headers)
    model = args.model or served or "default"
    tokenizer_path = args.tokenizer or model_path or args.model
    if not tokenizer_path:
        raise SystemExit("cannot find the tokenizer: pass --tokenizer PATH (or --model)")
    tokenizer = load_tokenizer(tokenizer_path)
    rows = get_dataset(args, tokenizer)
    if args.flush_cache:
        requests.post(f"{url}/flush_cache", headers=headers, timeout=60)

    print(f"#Input tokens: {sum(r.prompt_len for r in rows)}")
    print(f"#Output tokens: {sum(r.output_len for r in rows)}")
    outputs, duration = asyncio.run(benchmark(args, backend, url + ENDPOINTS[backend], model, rows, headers))

    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False)) if text else 0  # noqa: E731
    metrics, out_lens = calculate_metrics(outputs, duration, count)
    print(format_summary(metrics, args.backend, args.request_rate, args.max_concurrency))
    errors = [o.error for o in outputs if not o.success]
    if errors:
        print(f"{len(errors)} request(s) failed; first error: {errors[0]}", file=sys.stderr)

    record = {
        "tag": "serving",
        "backend": args.backend,
        "base_url": url,
        "model": model,
        "dataset_name": args.dataset_name,
        "num_prompts": len(rows),
        "request_rate": "inf" if args.request_rate == float("inf") else args.request_rate,
        "max_concurrency": args.max_concurrency,
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "seed": args.seed,
        **metrics_record(metrics),
    }
    if args.output_details:
        record.update(
            input_lens=[o.prompt_len for o in outputs],
            output_lens=out_lens,
            ttfts=[o.ttft for o in outputs],
            itls=[o.itl for o in outputs],
            generated_texts=[o.generated_text for o in outputs],
            errors=[o.error for o in outputs],
        )
    if args.output_file:
        with open(args.output_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    return record


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    record = run_benchmark(args)
    return 0 if record["completed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
