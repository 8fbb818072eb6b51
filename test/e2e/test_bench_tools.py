"""The benchmark tools end to end on the tiny dummy model: bench_serving (three backends, three
datasets) against the shared e2e server, bench_one_batch and bench_offline_throughput as CLIs,
plus the pure parts (datasets, metric formulas)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from sglang import bench_serving
from sglang.benchmark.backends import RequestFuncOutput
from sglang.benchmark.datasets import (
    sample_generated_shared_prefix_requests,
    sample_random_requests,
    sample_sharegpt_requests,
)
from sglang.benchmark.metrics import calculate_metrics
from server_helpers import API_KEY, REPO, TINY_LLAMA

pytestmark = pytest.mark.slow  # starts its own servers / engines

TOOL_TIMEOUT_S = 120


def run_tool(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", *args], cwd=str(REPO), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S
    )
    assert proc.returncode == 0, (
        f"{args[0]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


@pytest.fixture(scope="module")
def tokenizer():
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(TINY_LLAMA)


# ---------------------------------------------------------------------------- pure parts
def test_random_dataset_lengths(tokenizer) -> None:
    rng = np.random.default_rng(0)
    exact = sample_random_requests(48, 7, 6, 1.0, tokenizer, rng)
    assert [r.prompt_len for r in exact] == [48] * 6 and [r.output_len for r in exact] == [7] * 6
    for row in exact:  # the text really has that many tokens
        assert len(tokenizer.encode(row.prompt, add_special_tokens=False)) == 48 == len(row.prompt_ids)
    ranged = sample_random_requests(40, 10, 30, 0.5, tokenizer, rng)
    assert all(20 <= r.prompt_len <= 40 and 5 <= r.output_len <= 10 for r in ranged)
    assert len({r.prompt_len for r in ranged}) > 1


def test_sharegpt_and_shared_prefix_datasets(tokenizer, tmp_path) -> None:
    convs = [
        {
            "conversations": [
                {"from": "human", "value": f"hello there number {i} how are you"},
                {"from": "gpt", "value": "fine thanks " * (i + 1)},
            ]
        }
        for i in range(5)
    ] + [{"conversations": [{"from": "human", "value": "only one turn"}]}]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(convs))
    rows = sample_sharegpt_requests(str(path), 10, tokenizer, np.random.default_rng(0))
    assert len(rows) == 5  # the one-turn conversation is skipped
    assert sorted(r.output_len for r in rows) == sorted(
        len(tokenizer.encode("fine thanks " * (i + 1), add_special_tokens=False)) for i in range(5)
    )
    fixed = sample_sharegpt_requests(str(path), 3, tokenizer, np.random.default_rng(0), fixed_output_len=4)
    assert len(fixed) == 3 and all(r.output_len == 4 for r in fixed)

    gsp = sample_generated_shared_prefix_requests(3, 4, 40, 8, 5, tokenizer, np.random.default_rng(0))
    assert len(gsp) == 12 and all(r.output_len == 5 for r in gsp)
    prefixes = {r.prompt.split("\n\n")[0] for r in gsp}
    assert len(prefixes) == 3


def test_metric_formulas() -> None:
    outs = [
        RequestFuncOutput(
            success=True, latency=1.0, ttft=0.1, itl=[0.3, 0.3, 0.3], prompt_len=10, output_len=4
        ),
        RequestFuncOutput(success=True, latency=2.0, ttft=0.5, itl=[1.5], prompt_len=20, output_len=2),
        RequestFuncOutput(success=False, error="boom", prompt_len=30),
    ]
    m, out_lens = calculate_metrics(outs, duration=4.0, count_tokens=lambda text: 0)
    assert (m.completed, m.failed, m.total_input, m.total_output) == (2, 1, 30, 6)
    assert out_lens == [4, 2, 0]
    assert m.output_throughput == pytest.approx(1.5) and m.request_throughput == pytest.approx(0.5)
    assert m.ttft.mean == pytest.approx(300.0) and m.ttft.median == pytest.approx(300.0)
    assert m.tpot.mean == pytest.approx(((0.9 / 3) + 1.5) / 2 * 1000)  # (latency - ttft) / (n - 1)
    assert m.itl.max == pytest.approx(1500.0) and m.itl.median == pytest.approx(300.0)
    assert m.e2e.p99 == pytest.approx(1990.0)  # numpy linear interpolation of [1000, 2000]
    assert m.concurrency == pytest.approx(0.75)


# ---------------------------------------------------------------------------- bench_serving
def test_bench_serving_cli_sglang_backend(server, tmp_path) -> None:
    out_file = tmp_path / "serving.jsonl"
    stdout = run_tool(
        "sglang.bench_serving",
        "--backend",
        "sglang",
        "--base-url",
        server.url,
        "--api-key",
        API_KEY,
        "--dataset-name",
        "random",
        "--num-prompts",
        "8",
        "--random-input-len",
        "32",
        "--random-output-len",
        "6",
        "--random-range-ratio",
        "1.0",
        "--max-concurrency",
        "3",
        "--output-file",
        str(out_file),
        "--output-details",
    )
    assert "Serving Benchmark Result" in stdout
    for label in (
        "Successful requests:",
        "Output token throughput (tok/s):",
        "Median TTFT (ms):",
        "P99 ITL (ms):",
        "P90 TPOT (ms):",
        "Mean E2E Latency (ms):",
    ):
        assert label in stdout, label
    record = json.loads(out_file.read_text().splitlines()[-1])
    assert record["completed"] == 8 and record["failed"] == 0
    assert record["total_input_tokens"] == 8 * 32
    assert record["total_output_tokens"] == 8 * 6  # ignore_eos: every request runs to its length
    assert record["max_concurrency"] == 3 and record["request_rate"] == "inf"
    # One gap per streamed chunk after the first: 5 when every token arrives alone; a loaded box
    # may deliver two tokens in one chunk, never more chunks than tokens.
    assert all(1 <= len(itl) <= 5 for itl in record["itls"])
    assert 0 < record["median_ttft_ms"] <= record["p99_ttft_ms"]
    assert record["output_throughput"] > 0 and record["mean_tpot_ms"] > 0


@pytest.mark.parametrize("backend", ["openai", "openai-chat"])
def test_bench_serving_openai_backends(server, tmp_path, backend) -> None:
    convs = [
        {
            "conversations": [
                {"from": "human", "value": f"tell me a story about the number {i}"},
                {"from": "gpt", "value": "once upon a time " * 2},
            ]
        }
        for i in range(4)
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(convs))
    args = bench_serving.parse_args(
        [
            "--backend",
            backend,
            "--base-url",
            server.url,
            "--api-key",
            API_KEY,
            "--dataset-name",
            "sharegpt",
            "--dataset-path",
            str(path),
            "--num-prompts",
            "4",
            "--sharegpt-output-len",
            "5",
            "--request-rate",
            "50",
            "--disable-tqdm",
            "--output-file",
            str(tmp_path / "out.jsonl"),
        ]
    )
    record = bench_serving.run_benchmark(args)
    assert record["completed"] == 4 and record["total_output_tokens"] == 20
    assert record["request_rate"] == 50.0 and record["mean_ttft_ms"] > 0
    assert json.loads((tmp_path / "out.jsonl").read_text())["backend"] == backend


def test_bench_serving_shared_prefix_dataset(server) -> None:
    args = bench_serving.parse_args(
        [
            "--backend",
            "sglang",
            "--base-url",
            server.url,
            "--api-key",
            API_KEY,
            "--dataset-name",
            "generated-shared-prefix",
            "--gsp-num-groups",
            "2",
            "--gsp-prompts-per-group",
            "3",
            "--gsp-system-prompt-len",
            "48",
            "--gsp-question-len",
            "6",
            "--gsp-output-len",
            "3",
            "--disable-tqdm",
        ]
    )
    record = bench_serving.run_benchmark(args)
    assert record["completed"] == 6 and record["total_output_tokens"] == 18


# ---------------------------------------------------------------------------- offline tools
def test_bench_one_batch(tmp_path) -> None:
    out_file = tmp_path / "one_batch.jsonl"
    stdout = run_tool(
        "sglang.bench_one_batch",
        "--model-path",
        TINY_LLAMA,
        "--load-format",
        "dummy",
        "--dtype",
        "float32",
        "--batch-size",
        "2",
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--result-filename",
        str(out_file),
        "--log-level",
        "warning",
    )
    assert "Prefill. latency:" in stdout and "Decode 0. Batch size: 2," in stdout
    assert "Decode.  median latency:" in stdout and "Total. latency:" in stdout
    record = json.loads(out_file.read_text().splitlines()[-1])
    assert (record["batch_size"], record["input_len"], record["output_len"]) == (2, 16, 4)
    assert record["mode"] == "model_runner"
    assert record["prefill_throughput"] == pytest.approx(2 * 16 / record["prefill_latency"])
    assert record["median_decode_throughput"] == pytest.approx(2 / record["median_decode_latency"])
    assert record["total_latency"] > record["prefill_latency"]  # plus three decode steps


def test_bench_offline_throughput(tmp_path) -> None:
    out_file = tmp_path / "offline.jsonl"
    stdout = run_tool(
        "sglang.bench_offline_throughput",
        "--model-path",
        TINY_LLAMA,
        "--load-format",
        "dummy",
        "--dtype",
        "float32",
        "--dataset-name",
        "random",
        "--num-prompts",
        "5",
        "--random-input-len",
        "24",
        "--random-output-len",
        "7",
        "--random-range-ratio",
        "1.0",
        "--result-filename",
        str(out_file),
        "--log-level",
        "warning",
    )
    assert "Offline Throughput Benchmark Result" in stdout and "Output token throughput (tok/s):" in stdout
    record = json.loads(out_file.read_text().splitlines()[-1])
    assert record["successful_requests"] == 5
    assert record["total_input_tokens"] == 5 * 24 and record["total_output_tokens"] == 5 * 7
    assert record["output_throughput"] == pytest.approx(35 / record["total_latency"])
