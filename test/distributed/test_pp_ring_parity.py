"""Pipeline parallelism on spawned gloo ranks (the real PPDriver / PPStageWorker / PPComm) against
one in-process scheduler (pp = 1), float32, greedy: identical tokens, logprobs within 1e-4.

Mixed workload (pp_harness): a short prompt, prompts longer than the chunk (16) so chunked
prefill runs beside decodes, a radix-cache hit and a prompt extending a cached one in a second
wave (with a seeded sampled request and penalised ones), an abort mid-prefill (after its first
chunk was scheduled), an abort mid-decode, and a request arriving mid-pipeline. Afterwards every KV slot is free or evictable again (aborted and
finished requests released their KV once, on stage 0, for every stage).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.managers.io_struct import AbortReq
from sglang.srt.managers.pp.trace import merge_trace
from sglang.test.pp_harness import When, pp_rank_main, req, run_single_rank
from sglang.test.tiny_models import TINY_LLAMA_DIR, TINY_QWEN3_DIR, write_random_checkpoint

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

LOGPROB_TOL = 1e-4
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _workload(vocab: int) -> tuple[list[list], list[When]]:
    g = torch.Generator().manual_seed(1)

    def prompt(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    short, long1, mid, long2, late = prompt(5), prompt(41), prompt(23), prompt(60), prompt(30)
    waves = [
        [
            req("short", short, 20),
            req("long", long1, 12),
            req("mid", mid, 16),
            req("abort-prefill", long2, 16),
        ],
        [
            req("radix-hit", long1, 8),
            req("radix-extend", long1 + prompt(9), 8),
            # sampled on the last stage: per-request seed, penalties that need the prompt / outputs
            req("seeded", short, 8, temperature=0.8, top_p=0.9, seed=123, repetition_penalty=1.3),
            req("penalized", mid, 8, frequency_penalty=0.5, presence_penalty=0.3),
        ],
    ]
    triggers = [
        When("abort-prefill", [AbortReq(rid="abort-prefill")], min_kv_len=20),  # mid-prefill
        When("mid", [AbortReq(rid="mid")], min_output=3),  # mid-decode
        When("short", [req("late", late, 10)], min_output=2),  # arrives mid-pipeline
    ]
    return waves, triggers


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def setup(request, tmp_path_factory):
    src = TINY_LLAMA_DIR if request.param == "llama" else TINY_QWEN3_DIR
    path = str(write_random_checkpoint(src, tmp_path_factory.mktemp(request.param), seed=7))
    vocab = json.load(open(os.path.join(path, "config.json")))["vocab_size"]
    waves, triggers = _workload(vocab)
    base = dict(
        model_path=path,
        dtype="float32",
        num_threads=1,
        chunked_prefill_size=16,
        max_total_tokens=2048,
        log_level="warning",
    )
    return request.param, base, waves, triggers, run_single_rank(base, waves, triggers)


def _run_pp(base: dict, waves, triggers, world: int, env=None, **overrides) -> list[dict]:
    return run_ranks(pp_rank_main, world, args=({**base, **overrides}, waves, triggers, env), timeout=120)


def _check_same(ref: dict, got: dict) -> None:
    assert set(got) == set(ref)
    for rid, r in ref.items():
        g = got[rid]
        assert g.finish["type"] == r.finish["type"], rid
        assert g.output_ids == r.output_ids, f"{rid}: greedy tokens differ"
        assert g.cached_tokens == r.cached_tokens, rid
        if r.logprobs:
            assert max(abs(a - b) for a, b in zip(r.logprobs, g.logprobs)) <= LOGPROB_TOL, rid


def _check_workload_shape(ref: dict) -> None:
    """The reference itself exercised what the workload is for."""
    assert ref["abort-prefill"].finish["type"] == "abort" and not ref["abort-prefill"].output_ids
    assert ref["mid"].finish["type"] == "abort" and len(ref["mid"].output_ids) == 3
    assert ref["radix-hit"].cached_tokens == 40 and ref["radix-extend"].cached_tokens >= 41
    assert ref["late"].finish["type"] == "length"


def _check_kv_released(entry: dict) -> None:
    state = entry["state"]
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
    assert state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0


def test_pp2_mixed_workload_and_trace(setup, tmp_path):
    model, base, waves, triggers, ref = setup
    _check_workload_shape(ref["outputs"])
    trace = str(tmp_path / "pp2.json")
    results = _run_pp(base, waves, triggers, 2, pp_size=2, pp_trace_path=trace)
    entry = results[0]
    _check_same(ref["outputs"], entry["outputs"])
    _check_kv_released(entry)
    stats = entry["stats"]
    assert stats["max_in_flight"] == 2  # pp_size + async depth 0
    assert stats["overlapped"] >= 1, "chunk k+1 never entered stage 0 while chunk k was in flight"
    assert results[1]["micro_batches"] == stats["micro_batches"]
    assert [r["layers"] for r in results] == ([(0, 2), (2, 4)] if model == "llama" else [(0, 1), (1, 3)])
    assert len(entry["state"]["pp_bubble_ratio"]) == 2

    events = merge_trace(trace)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {0: "rank 0 (pp 0, tp 0)", 1: "rank 1 (pp 1, tp 0)"}
    fwd = [e for e in events if e["ph"] == "X" and e["name"] == "forward"]
    assert {e["pid"] for e in fwd} == {0, 1} and len(fwd) == 2 * stats["micro_batches"]
    assert any(e["args"].get("chunk_len") == 16 and e["args"]["rids"] == ["long"] for e in fwd)
    mixed = [e for e in fwd if 1 in e["args"]["extend_lens"] and max(e["args"]["extend_lens"]) > 1]
    assert mixed, "no micro-batch mixed decodes with a prefill chunk"
    assert {e["name"] for e in events if e["pid"] == 1} >= {"forward", "recv wait", "send"}

    spec = importlib.util.spec_from_file_location(
        "pp_trace_report", os.path.join(REPO, "benchmark/pp/trace_report.py")
    )
    report_mod = importlib.util.module_from_spec(spec)
    sys.modules["pp_trace_report"] = report_mod  # dataclasses look their module up
    spec.loader.exec_module(report_mod)
    report = report_mod.bubble_report(events, "long")
    assert report.chunks >= 3 and set(report.bubble) == {0, 1}
    assert all(0.0 <= b < 1.0 for b in report.bubble.values())
    png = str(tmp_path / "timeline.png")
    report_mod.plot_timeline(events, report, png)
    assert os.path.getsize(png) > 1000


def test_pp3_uneven_partition(setup):
    model, base, waves, triggers, ref = setup
    partition = "1,2,1" if model == "llama" else "1,1,1"
    results = _run_pp(base, waves, triggers, 3, env={"SGLANG_PP_LAYER_PARTITION": partition}, pp_size=3)
    _check_same(ref["outputs"], results[0]["outputs"])
    _check_kv_released(results[0])
    expected = [(0, 1), (1, 3), (3, 4)] if model == "llama" else [(0, 1), (1, 2), (2, 3)]
    assert [r["layers"] for r in results] == expected


def test_pp4(setup):
    model, base, waves, triggers, ref = setup
    if model != "llama":
        pytest.skip("tiny-qwen3 has 3 layers")
    results = _run_pp(base, waves, triggers, 4, pp_size=4)
    _check_same(ref["outputs"], results[0]["outputs"])
    _check_kv_released(results[0])
    assert results[0]["stats"]["max_in_flight"] == 4


def test_pp2_retraction_micro_batch_cap_async_depth(setup):
    """A KV pool too small for the workload (retractions while micro-batches are in flight), at most
    2 requests per micro-batch, a ring of pp + 1 slots, pages of 4 tokens."""
    model, base, waves, triggers, _ = setup
    if model != "llama":
        pytest.skip("one model is enough")
    tight = {**base, "max_total_tokens": 96, "disable_radix_cache": True, "page_size": 4}
    ref = run_single_rank(tight, waves, triggers)
    results = _run_pp(tight, waves, triggers, 2, pp_size=2, pp_max_micro_batch_size=2, pp_async_batch_depth=1)
    _check_same(ref["outputs"], results[0]["outputs"])
    _check_kv_released(results[0])
    assert results[0]["num_retractions"] > 0, "the pool was meant to force retractions"
    assert results[0]["stats"]["max_in_flight"] == 3


def test_pp2_tp2(setup):
    model, base, waves, triggers, ref = setup
    if model != "llama":
        pytest.skip("one model is enough")
    results = _run_pp(base, waves, triggers, 4, pp_size=2, tp_size=2)
    _check_same(ref["outputs"], results[0]["outputs"])
    _check_kv_released(results[0])
    # the other rank of stage 0 is a mirror: same micro-batches, same state
    mirror = lambda r: (
        {k: v for k, v in r["stats"].items() if k != "output_waits"},  # noqa: E731
        # not the entry-rank-only bubble ratio, nor timings of each rank's own clock
        {k: v for k, v in r["state"].items() if k not in ("pp_bubble_ratio", "gen_throughput", "queue_time")},
    )
    assert mirror(results[1]) == mirror(results[0])
    assert results[2]["micro_batches"] == results[3]["micro_batches"] == results[0]["stats"]["micro_batches"]
