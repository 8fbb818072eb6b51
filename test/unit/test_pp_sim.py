"""Pipeline simulator (python -m sglang.srt.tools.pp_sim): timing, metrics, ingestion, CLI."""

import json

import pytest

from sglang.srt.managers.dynamic_chunking import AutoChunkPlanner, QuadraticLatencyModel, TransferModel
from sglang.srt.tools import pp_sim
from sglang.srt.tools.pp_sim_core import (
    ChunkPolicy,
    StageCostModel,
    efficiency,
    plan_for,
    plan_table,
    simulate,
    simulate_policy,
    single_stage_ttft,
    stage_weights,
)
from sglang.srt.tools.pp_sim_measure import default_points, measure_chunk_latencies, measure_ttft
from sglang.srt.tools.pp_sim_trace import fit_cost_model, load_ttfts, parse_measurements

COST = StageCostModel(2.3e-9, 6e-5, 0.05, TransferModel(1e-4, 7e-8))


def test_linear_pipeline_has_textbook_ttft_and_bubble():
    cost = StageCostModel(0.0, 1e-3, 0.0)  # every 1000-token chunk: 1 s of work, 1/pp per stage
    for pp in (1, 2, 4):
        r = simulate(cost, pp, [1000] * 8)
        assert r.ttft == pytest.approx((8 + pp - 1) / pp)
        assert r.bubble_ratio == pytest.approx(1 - 8 / (8 + pp - 1))
        assert r.stage_bubble == pytest.approx([1 - 8 / (8 + pp - 1)] * pp)
    t1 = single_stage_ttft(cost, 8000, 1000)
    assert t1 == pytest.approx(8.0)
    assert efficiency(t1, simulate(cost, 4, [1000] * 8)) == pytest.approx(8 / (4 * 11 / 4))


def test_uneven_partition_and_hops():
    assert stage_weights(4, [15, 15, 15, 16]) == pytest.approx([15 / 61] * 3 + [16 / 61])
    with pytest.raises(ValueError):
        stage_weights(2, [1, 2, 3])
    cost = StageCostModel(0.0, 1e-3, 0.0, TransferModel(0.5, 0.0))
    r = simulate(cost, 2, [1000], partition=[1, 3])
    assert r.ttft == pytest.approx(0.25 + 0.5 + 0.75)
    assert r.timeline.start[0][1] == pytest.approx(0.75)


def test_planner_prediction_matches_simulation():
    planner = AutoChunkPlanner(
        4096, max_chunk_size=16384, prior=COST.stage_model(1 / 4), transfer=COST.transfer
    )
    plan = planner.plan_chunks(100_000, 4)
    assert simulate(COST, 4, plan).ttft == pytest.approx(planner.predict_ttft(plan, 4), rel=1e-12)


def test_policies():
    fixed = plan_for(ChunkPolicy("fixed", 4096), COST, 4, 10_000)
    assert fixed == [4096, 4096, 1808]
    up = ChunkPolicy("upstream", 12288, 0.65)
    assert plan_for(up, COST, 1, 30_000) == [12288, 12288, 5424]  # pp = 1: fixed chunks
    plan = plan_for(up, COST, 4, 200_000)
    assert plan[0] == 12288 and plan[1] < 12288 and sum(plan) == 200_000
    for pp in (2, 4, 8):
        auto = simulate_policy(ChunkPolicy("auto", 4096), COST, pp, 131_072)
        base = simulate_policy(ChunkPolicy("fixed", 4096), COST, pp, 131_072)
        assert auto.ttft <= base.ttft
        assert auto.chunks[-1] >= 1024
    assert ChunkPolicy.parse("upstream:8192:0.8") == ChunkPolicy("upstream", 8192, 0.8)
    assert ChunkPolicy.parse("auto:4096:8192").max_chunk == 8192
    with pytest.raises(ValueError):
        ChunkPolicy("magic", 1)


def test_plan_table_rows():
    rows = plan_table(
        COST, [2, 4], [32768, 65536], [ChunkPolicy("fixed", 4096), ChunkPolicy("auto", 4096)], 4096
    )
    assert len(rows) == 8
    assert all(0 < r["efficiency"] <= 1 and 0 <= r["bubble"] < 1 for r in rows)


def test_trace_and_record_ingestion_and_fit():
    true = QuadraticLatencyModel(3e-9, 8e-5, 0.02)  # per stage, measured at pp = 2
    events, records = [], []
    ts = 0.0
    for stage in (0, 1):
        for L in range(0, 60_000, 6000):
            for x in (1024, 4096):
                dur = true.chunk_latency(L, x) * 1e6
                events.append(
                    {
                        "name": "forward_extend",
                        "ph": "X",
                        "ts": ts,
                        "dur": dur,
                        "pid": stage,
                        "args": {"prefix_len": L, "extend_len": x, "pp_rank": stage},
                    }
                )
                records.append({"prefix_len": L, "chunk_len": x, "latency_ms": dur / 1e3, "stage": stage})
                ts += dur
    events.append({"name": "other", "ph": "X", "ts": 0, "dur": 5, "args": {}})
    events += [
        {"name": "be", "ph": "B", "ts": 0, "pid": 9, "tid": 1, "args": {"chunk_len": 100}},
        {"name": "be", "ph": "E", "ts": 1000, "pid": 9, "tid": 1},
    ]
    ms = parse_measurements(json.dumps({"traceEvents": events}))
    assert len(ms) == 41 and ms[-1].latency_s == pytest.approx(1e-3) and ms[-1].stage == 9
    assert len(parse_measurements(json.dumps({"traceEvents": events}), name_filter="forward")) == 40
    assert len(parse_measurements(json.dumps(records))) == 40
    csv_text = "prefix_len,chunk_len,latency_s\n0,100,0.5\n10,100,0.6\n"
    assert [m.latency_s for m in parse_measurements(csv_text)] == [0.5, 0.6]
    jsonl = "\n".join(json.dumps(r) for r in records[:3])
    assert len(parse_measurements(jsonl)) == 3
    cost = fit_cost_model(parse_measurements(json.dumps(records)), measured_pp=2)
    assert cost.a == pytest.approx(6e-9, rel=1e-6) and cost.b == pytest.approx(1.6e-4, rel=1e-6)
    assert cost.c == pytest.approx(0.02, rel=1e-5)
    iso = fit_cost_model(parse_measurements(json.dumps(records)), measured_pp=2, isolated=True)
    assert iso.a == pytest.approx(3e-9, rel=1e-6) and iso.c == pytest.approx(0.01, rel=1e-5)


class FakeEngine:
    """Records calls; a prefill "takes" no time but the call order is what we check."""

    def __init__(self):
        self.calls = []

    def flush_cache(self):
        self.calls.append("flush")

    def generate(self, input_ids, sampling_params):
        self.calls.append((len(input_ids), sampling_params["max_new_tokens"]))


def test_measure_helpers_drive_the_engine():
    eng = FakeEngine()
    pts = default_points(1024, 2048, steps=2)
    assert pts == [(0, 512), (0, 1024), (1024, 512), (1024, 1024), (2048, 512), (2048, 1024)]
    ms = measure_chunk_latencies(eng, [(0, 256), (512, 256)], repeats=2, stat="min")
    assert [(m.prefix_len, m.chunk_len) for m in ms] == [(0, 256), (512, 256)]
    assert eng.calls[0] == (256, 0) and eng.calls.count("flush") == 4
    for i, call in enumerate(eng.calls):  # every prefix-512 measurement caches its prefix first
        if call == (768, 0):
            assert eng.calls[i - 2 : i] == ["flush", (512, 0)]
    assert eng.calls.count((768, 0)) == 2
    eng.calls.clear()
    rows = measure_ttft(eng, [300, 200], repeats=2)
    assert [n for n, _ in rows] == [300, 200]
    assert eng.calls == ["flush", (300, 1), "flush", (200, 1)] * 2
    with pytest.raises(ValueError):
        measure_ttft(eng, [300], repeats=1, stat="mean")


def test_load_ttfts_formats(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"ttft": [{"prompt_len": 2048, "ttft_s": 1.5}]}))
    assert load_ttfts(str(p)) == [(2048, 1.5)]
    p.write_text(json.dumps({"4096": 2.0, "1024": 0.5}))
    assert load_ttfts(str(p)) == [(1024, 0.5), (4096, 2.0)]


def test_cli_run_plan_fit_validate(tmp_path, capsys):
    png = tmp_path / "timeline.png"
    rc = pp_sim.main(
        [
            "run",
            "--coeffs",
            "2.3e-9,6e-5,0.05",
            "--pp",
            "4",
            "--prompt-len",
            "65536",
            "--policy",
            "fixed:4096",
            "--policy",
            "auto:4096",
            "--png",
            str(png),
        ]
    )
    assert rc == 0 and png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "fixed C=4096" in out and "auto C=4096" in out and "TTFT" in out

    assert pp_sim.main(["plan", "--preset", "h20-dsv31-tp8", "--pp", "2", "--prompts", "32768"]) == 0
    assert "| 32768 | 2 | upstream C=4096 a=0.75 |" in capsys.readouterr().out

    recs = [
        {"prefix_len": L, "chunk_len": x, "latency_s": COST.stage_time(L, x, 1.0)}
        for L in (0, 8192, 16384, 32768)
        for x in (1024, 2048, 4096)
    ]
    (tmp_path / "m.json").write_text(json.dumps(recs))
    model = tmp_path / "model.json"
    assert pp_sim.main(["fit", str(tmp_path / "m.json"), "-o", str(model)]) == 0
    assert json.loads(model.read_text())["a"] == pytest.approx(COST.a, rel=1e-6)
    capsys.readouterr()

    truth = {n: simulate_policy(ChunkPolicy("fixed", 2048), COST, 2, n).ttft for n in (4096, 8192, 16384)}
    (tmp_path / "ok.json").write_text(json.dumps({str(n): t * 1.05 for n, t in truth.items()}))
    (tmp_path / "bad.json").write_text(json.dumps({str(n): t * 1.5 for n, t in truth.items()}))
    base = ["validate", "--model", str(model), "--pp", "2", "--policy", "fixed:2048", "--measured"]
    assert pp_sim.main(base + [str(tmp_path / "ok.json")]) == 0
    assert pp_sim.main(base + [str(tmp_path / "bad.json")]) == 1
    assert "worst |error|" in capsys.readouterr().out
    flat = [{"prefix_len": L, "chunk_len": 512, "latency_s": 1.0 + 1e-6 * L} for L in range(0, 8192, 512)]
    (tmp_path / "flat.json").write_text(json.dumps(flat))
    assert pp_sim.main(["fit", str(tmp_path / "flat.json")]) == 2  # a <= 0: clean error, no traceback
