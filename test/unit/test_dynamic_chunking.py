"""Dynamic chunking: upstream-compatible predictor, auto planner, pipeline timing (pure, fast)."""

import logging
import os
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest

from sglang.srt import envs
from sglang.srt.managers.dynamic_chunking import (
    AutoChunkPlanner,
    ChunkSample,
    ChunkSizePredictor,
    FitError,
    QuadraticLatencyModel,
    TransferModel,
    build_chunk_policy,
    fit_cumulative,
    merge_stage_latencies,
    profile_lengths,
    resolve_dynamic_chunking,
    robust_fit_chunks,
    run_pipeline,
    time_prefills,
    uniform_makespan,
)

# With f(l) = l² + 7 (a=1, b=0) and C = 4096 the target is T = C², and the exact next chunk at
# prefix L is x = √(L² + C²) − L: L = 3072 → x = 5120 − 3072 = 2048 (a 3-4-5 triangle).
UNIT = QuadraticLatencyModel(1.0, 0.0, 7.0)


def predictor(c=4096, alpha=1.0, model=UNIT, **kw):
    p = ChunkSizePredictor(c, smooth_factor=alpha, **kw)
    assert p.set_model(model)
    return p


# ------------------------------------------------------------------ upstream predictor: exact values
@pytest.mark.parametrize("alpha,expected", [(1.0, 2048), (0.75, 2560), (0.7, 2624), (0.5, 3072)])
def test_exact_sizes_for_known_coefficients(alpha, expected):
    # s = C + α(x − C), truncated, then rounded down to 64: α=0.7 → 2662.4 → 2662 → 2624.
    p = predictor(alpha=alpha)
    assert p.next_chunk_size(0) == 4096
    assert p.next_chunk_size(3072) == expected


def test_exact_size_other_triangle_and_scale_invariance():
    # (8, 15, 17)·256: L = 2048, C = 3840 → x = 4352 − 2048 = 2304.
    assert predictor(c=3840).next_chunk_size(2048) == 2304
    # Latencies in seconds on a real GPU: same shape, same sizes.
    tiny = QuadraticLatencyModel(2.5e-9, 0.0, 0.03)
    assert predictor(model=tiny).next_chunk_size(3072) == 2048


def test_with_linear_term_matches_quadratic_formula():
    a, b, c_ = 2e-9, 6e-5, 0.05
    p = predictor(c=8192, alpha=1.0, model=QuadraticLatencyModel(a, b, c_))
    t = a * 8192**2 + b * 8192
    big_b = 2 * a * 50_000 + b
    x = (-big_b + (big_b**2 + 4 * a * t) ** 0.5) / (2 * a)
    assert p.next_chunk_size(50_000) == int(x) // 64 * 64


def test_fit_recovers_coefficients_and_drops_warmup():
    lengths = profile_lengths(4096, tp_size=2, page_size=16, n=32)
    lat = [3e-9 * l * l + 4e-5 * l + 0.02 for l in lengths]
    lat[0] = 99.0  # cold first run: must be dropped
    p = ChunkSizePredictor(4096, smooth_factor=1.0)
    assert p.fit(lengths, lat)
    assert p.model.a == pytest.approx(3e-9, rel=1e-7)
    assert p.model.b == pytest.approx(4e-5, rel=1e-7)
    assert p.model.c == pytest.approx(0.02, rel=1e-6)
    assert p.target == pytest.approx(3e-9 * 4096**2 + 4e-5 * 4096, rel=1e-7)


def test_floor_at_quarter_chunk_then_alignment():
    # Far into a huge prompt x → ~0.84 tokens; floor C // 4 = 1024.
    assert predictor().next_chunk_size(10**7) == 1024
    # α = 0.7: s = 1229.4 → max(1229, 1024) → 1216 (64-aligned).
    assert predictor(alpha=0.7).next_chunk_size(10**7) == 1216
    # C = 1000: floor 250 → rounded down to 192.
    assert predictor(c=1000).next_chunk_size(10**7) == 192


def test_alignment_to_page_size():
    assert predictor(alpha=0.7, page_size=256).next_chunk_size(3072) == 2560
    assert predictor(alpha=0.7, page_size=16).next_chunk_size(3072) == 2624  # 64 wins
    assert predictor(c=1000).next_chunk_size(0) == 960  # x = C = 1000 → 960


def test_caps_by_max_prefill_tokens_and_context():
    assert predictor(alpha=0.5, max_prefill_tokens=2000).next_chunk_size(3072) == 1984
    # context: 5000 − 3072 − 100 = 1828 → 1792.
    assert predictor(alpha=0.5, context_len=5000).next_chunk_size(3072) == 1792
    # Capped below one alignment unit → None → C (upstream semantics).
    p = predictor(context_len=3200)
    assert p.predict(3072) is None and p.next_chunk_size(3072) == 4096


def test_alpha_zero_gives_fixed_chunks():
    p = predictor(c=1000, alpha=0.0)
    assert p.next_chunk_size(10**6) == 1000
    assert p.plan_chunks(2500) == [1000, 1000, 500]


def test_rejected_fit_falls_back_to_fixed(caplog):
    lengths = list(range(4096, 0, -256))
    concave = [-1e-6 * l * l + 1e-2 * l for l in lengths]  # a < 0
    p = ChunkSizePredictor(4096, smooth_factor=0.75)
    with caplog.at_level(logging.WARNING):
        assert not p.fit(lengths, concave)
    assert "falling back to fixed" in caplog.text
    assert not p.is_fitted
    assert [p.next_chunk_size(L) for L in (0, 4096, 10**6)] == [4096] * 3
    assert not p.fit(lengths[:8], [l * l for l in lengths[:8]])  # 7 points after warm-up
    assert not p.set_model(QuadraticLatencyModel(0.0, 1.0, 0.0))  # a = 0 is rejected too


def test_negative_linear_term_is_clamped():
    p = predictor(model=QuadraticLatencyModel(1.0, -500.0, 3.0))
    assert p.model.b == 0.0
    assert p.next_chunk_size(3072) == 2048  # same as b = 0


def test_plan_chunks_covers_prompt_and_shrinks():
    p = predictor(alpha=0.75)
    plan = p.plan_chunks(40_000, prefix_len=1000)
    assert sum(plan) == 39_000
    assert plan[0] == p.next_chunk_size(1000)
    assert all(x >= y for x, y in zip(plan[:-2], plan[1:-1]))  # non-increasing (tail aside)
    with pytest.raises(ValueError):
        p.plan_chunks(10, prefix_len=20)


def test_profile_lengths_divisible_by_tp_and_page():
    lengths = profile_lengths(3072, tp_size=8, page_size=1)  # upstream's step bug case
    assert lengths[0] == 3840 and len(lengths) == 128
    assert all(l % 8 == 0 and l > 0 for l in lengths)
    assert lengths == sorted(set(lengths), reverse=True)
    lengths = profile_lengths(4096, tp_size=3, page_size=64, n=16)
    assert all(l % 192 == 0 for l in lengths) and len(lengths) == 16 and max(lengths) <= 5120
    assert profile_lengths(64, tp_size=1, page_size=128) == []


def test_merge_stage_latencies_is_elementwise_max():
    assert merge_stage_latencies([[1.0, 5.0], [2.0, 3.0]]) == [2.0, 5.0]
    with pytest.raises(ValueError):
        merge_stage_latencies([[1.0], [1.0, 2.0]])


def test_time_prefills_measures_between_synchronizations():
    now, events = [0.0], []

    def run(n):
        events.append(("run", n))
        now[0] += n * 1e-3

    def sync():
        events.append("sync")
        now[0] += 0.5  # waiting for the device: only the sync after the run is inside the timing

    lat = time_prefills(run, [300, 100], synchronize=sync, clock=lambda: now[0])
    assert lat == pytest.approx([0.3 + 0.5, 0.1 + 0.5])  # the closing sync belongs to the run
    assert events == ["sync", ("run", 300), "sync", "sync", ("run", 100), "sync"]


# ------------------------------------------------------------------ ranks agree
def _rank_plan(stage_lists):
    lengths = profile_lengths(8192, tp_size=4, page_size=32)
    p = ChunkSizePredictor(8192, smooth_factor=0.65, page_size=32, max_prefill_tokens=16384)
    p.fit(lengths, merge_stage_latencies(stage_lists))
    return [p.next_chunk_size(L) for L in range(0, 1_000_000, 7919)]


def test_every_rank_computes_the_same_chunk_sizes():
    rng = random.Random(0)
    lengths = profile_lengths(8192, tp_size=4, page_size=32)
    stages = [[2e-9 * l * l + 5e-5 * l + 0.01 + rng.uniform(0, 1e-3) for l in lengths] for _ in range(4)]
    plans = {tuple(_rank_plan(stages)) for _ in range(4)}
    assert len(plans) == 1
    # Shipping the fitted state instead of the data gives the same sizes too.
    p = ChunkSizePredictor(8192, smooth_factor=0.65, page_size=32, max_prefill_tokens=16384)
    p.fit(lengths, merge_stage_latencies(stages))
    q = ChunkSizePredictor.from_dict(p.to_dict())
    assert [q.next_chunk_size(L) for L in range(0, 1_000_000, 7919)] == list(plans.pop())


def test_ranks_in_separate_processes_agree():
    code = (
        "from sglang.srt.managers.dynamic_chunking import *\n"
        "ls = profile_lengths(6144, 2, 16)\n"
        "p = ChunkSizePredictor(6144, page_size=16)\n"
        "p.fit(ls, [1.7e-9*l*l + 3.3e-5*l + 0.013 + (l % 7) * 1e-5 for l in ls])\n"
        "a = AutoChunkPlanner(6144, max_chunk_size=16384)\n"
        "[a.observe(L, x, 1.7e-9*(2*L*x + x*x) + 3.3e-5*x + 0.013 + (L % 5) * 1e-4)"
        " for L in range(0, 200000, 9000) for x in (1024, 4096)]\n"
        "print(p.plan_chunks(300001), a.plan_chunks(300001, 4))\n"
    )
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR": "0.7"}
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
        )
        outs.add(proc.stdout)
    assert len(outs) == 1 and "[" in outs.pop()


# ------------------------------------------------------------------ env + flags
def test_smooth_factor_env(monkeypatch):
    monkeypatch.setenv("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR", "0.6")
    assert ChunkSizePredictor(4096).smooth_factor == 0.6
    monkeypatch.setenv("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR", "lots")
    with pytest.raises(ValueError, match="SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR"):
        ChunkSizePredictor(4096)
    monkeypatch.setenv("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR", "1.5")
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        ChunkSizePredictor(4096)
    monkeypatch.delenv("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR")
    assert envs.SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR.get() == 0.75


def test_flags_resolve_and_warn_with_pp1(caplog):
    with caplog.at_level(logging.WARNING):
        assert resolve_dynamic_chunking(True, "upstream", 1, 8192) is None
    assert "only matters with --pp-size > 1" in caplog.text
    assert resolve_dynamic_chunking(False, "upstream", 4, 8192) is None
    assert resolve_dynamic_chunking(True, "upstream", 4, 8192) == "upstream"
    assert resolve_dynamic_chunking(False, "auto", 4, 8192) == "auto"
    assert resolve_dynamic_chunking(True, "upstream", 4, -1) is None
    with pytest.raises(ValueError):
        resolve_dynamic_chunking(True, "magic", 4, 8192)
    args = SimpleNamespace(
        enable_dynamic_chunking=True,
        dynamic_chunking_mode="upstream",
        pp_size=2,
        chunked_prefill_size=8192,
        page_size=1,
        max_prefill_tokens=16384,
        pp_async_batch_depth=0,
    )
    assert isinstance(build_chunk_policy(args, context_len=32768), ChunkSizePredictor)
    args.dynamic_chunking_mode = "auto"
    planner = build_chunk_policy(args)
    assert isinstance(planner, AutoChunkPlanner) and planner.cap == 16384


# ------------------------------------------------------------------ auto planner
TRUE = QuadraticLatencyModel(2e-9, 6e-5, 0.04)


def _check_plan(plan, n, planner):
    assert sum(plan) == n
    assert all(x % planner.alignment == 0 for x in plan[:-1])
    assert all(planner.body_floor <= x <= planner.cap for x in plan[:-1])
    assert min(n, planner.tail_floor) <= plan[-1] <= planner.cap


def test_auto_plans_respect_alignment_caps_and_tail_floor():
    planner = AutoChunkPlanner(4096, page_size=16, max_chunk_size=16384, prior=TRUE)
    for n in (1, 500, 1023, 1025, 4097, 5000, 16385, 17000, 33_333, 131_071, 400_000):
        for pp in (1, 2, 4, 8):
            _check_plan(planner.plan_chunks(n + 100, pp, prefix_len=100), n, planner)


def test_auto_merges_tiny_tail():
    planner = AutoChunkPlanner(4096, max_chunk_size=16384)  # no model: fixed C with tail rule
    assert planner.plan_chunks(8192 + 100, 4) == [4096, 4196]
    assert planner.plan_chunks(16384 * 2 + 100, 4)[-1] >= 1024


def test_auto_pp1_uses_largest_chunks_and_beats_fixed_at_pp8():
    planner = AutoChunkPlanner(4096, max_chunk_size=16384, prior=TRUE)
    assert planner.plan_chunks(40_000, 1) == [16384, 16384, 7232]
    fixed = [4096] * 32
    for pp in (2, 4, 8):
        plan = planner.plan_chunks(131_072, pp)
        assert planner.predict_ttft(plan, pp) <= planner.predict_ttft(fixed, pp)
    plan = planner.plan_chunks(131_072, 8)
    assert plan[0] > plan[-1]  # later chunks shrink: attention over the prefix grows
    assert planner.predict_ttft(plan, 8) < 0.97 * planner.predict_ttft(fixed, 8)


def test_online_fit_is_robust_to_noise_and_outliers():
    rng = random.Random(1)
    planner = AutoChunkPlanner(4096, max_chunk_size=16384, forgetting=0.995)
    assert planner.model is None
    assert not planner.fit([1, 1, 1, 1], [1.0, 1.0, 1.0, 1.0])  # failed profile fit: no prior
    for i in range(200):
        L, x = rng.randrange(0, 200_000, 64), rng.choice((1024, 2048, 4096, 8192))
        t = TRUE.chunk_latency(L, x) * rng.uniform(0.97, 1.03)
        if i % 25 == 0:
            t *= 5.0  # a stall
        planner.observe(L, x, t)
    m = planner.model
    assert m.a == pytest.approx(TRUE.a, rel=0.05) and m.b == pytest.approx(TRUE.b, rel=0.1)
    oracle = AutoChunkPlanner(4096, max_chunk_size=16384, prior=TRUE)
    best = oracle.predict_ttft(oracle.plan_chunks(131_072, 4), 4)
    assert oracle.predict_ttft(planner.plan_chunks(131_072, 4), 4) <= 1.01 * best


def test_profile_seeds_the_prior():
    lengths = profile_lengths(4096, n=32)
    planner = AutoChunkPlanner(4096, max_chunk_size=16384)
    assert planner.fit(lengths, [TRUE.cumulative(l) for l in lengths])
    assert planner.model.a == pytest.approx(TRUE.a, rel=1e-6) and planner.model.c == pytest.approx(
        TRUE.c, rel=1e-6
    )
    assert planner.plan_chunks(131_072, 8) != planner.plan_chunks(131_072, 1)


def test_forgetting_follows_a_change():
    planner = AutoChunkPlanner(4096, forgetting=0.95, window=128)
    slow = TRUE.scaled(2.0)
    for model in (TRUE, slow):
        for i in range(60):
            L, x = 3000 * i, (1024, 4096)[i % 2]
            planner.observe(L, x, model.chunk_latency(L, x))
    assert planner.model.a == pytest.approx(slow.a, rel=0.05)


def test_auto_ignores_degenerate_fits_and_is_deterministic():
    planner = AutoChunkPlanner(4096, prior=TRUE)
    for i in range(20):
        planner.observe(1000 * i, 2048, 0.1)  # flat: no quadratic growth
    assert planner.model.a > 0
    twin_a, twin_b = (
        AutoChunkPlanner(4096, max_chunk_size=12288),
        AutoChunkPlanner(4096, max_chunk_size=12288),
    )
    rng = random.Random(7)
    for _ in range(50):
        L, x = rng.randrange(0, 10**5), rng.choice((512, 4096))
        t = TRUE.chunk_latency(L, x) * rng.uniform(0.9, 1.1)
        twin_a.observe(L, x, t)
        twin_b.observe(L, x, t)
    assert twin_a.plan_chunks(250_000, 8) == twin_b.plan_chunks(250_000, 8)
    assert twin_a.next_chunk_size(250_000, 0, 8) == twin_a.plan_chunks(250_000, 8)[0]
    assert twin_a.chunk_budget(250_000, 4096, 8) == twin_a.plan_chunks(250_000, 8, 4096)[0]
    assert predictor(alpha=0.75).chunk_budget(99_999, 3072, 8) == 2560


# ------------------------------------------------------------------ fits and pipeline timing
def test_fits_reject_bad_input():
    with pytest.raises(FitError):
        fit_cumulative([1, 1, 1], [1.0, 2.0, 3.0])
    with pytest.raises(FitError):
        robust_fit_chunks([ChunkSample(0, 10, 1.0)])


def test_uniform_makespan_closed_form_and_event_recurrence_agree():
    rng = random.Random(3)
    times = [rng.uniform(0.1, 1.0) for _ in range(17)]
    hops = [rng.uniform(0.0, 0.05) for _ in range(17)]
    for pp in (1, 2, 5):
        closed = sum(times) + (pp - 1) * max(t + d for t, d in zip(times, hops))
        assert uniform_makespan(times, pp, hops) == pytest.approx(closed)
        grid = [[t] * pp for t in times]
        for ring in (None, pp, pp + 1):
            ev = run_pipeline(grid, hops, ring_slots=ring, return_time=0.3).makespan
            assert uniform_makespan(times, pp, hops, ring_slots=ring, return_time=0.3) == pytest.approx(ev)
    # A tight ring with a slow return really delays the pipeline.
    assert uniform_makespan([1.0] * 8, 2, ring_slots=2, return_time=2.0) > uniform_makespan([1.0] * 8, 2)


def test_transfer_model():
    assert TransferModel(0.001, 1e-6).hop(1000) == pytest.approx(0.002)


# ------------------------------------------------------------------ prefix-read term, plan following
def test_prefix_term_is_fitted_when_identifiable_else_zero():
    true = QuadraticLatencyModel(2e-9, 5e-5, 0.02, 3e-6)
    rng = random.Random(3)
    samples = []
    for _ in range(80):
        L, x = rng.randrange(0, 100_000, 64), rng.choice((512, 1024, 2048, 4096))
        samples.append(ChunkSample(L, x, true.chunk_latency(L, x) * rng.uniform(0.99, 1.01)))
    m = robust_fit_chunks(samples, prefix_term=True)
    assert m.e == pytest.approx(true.e, rel=0.1) and m.a == pytest.approx(true.a, rel=0.05)
    assert robust_fit_chunks(samples).e == 0.0  # default: upstream-shaped 3-coefficient fit
    # no prefix variation: e cannot be told from c, so it stays 0 (no singular-fit error)
    flat = [ChunkSample(0, x, true.chunk_latency(0, x)) for x in (512, 1024, 2048, 4096, 8192)]
    assert robust_fit_chunks(flat, prefix_term=True).e == 0.0
    assert QuadraticLatencyModel.from_dict(true.to_dict()) == true
    assert true.chunk_latency(1000, 10) == pytest.approx(2e-9 * (20_000 + 100) + 5e-4 + 0.02 + 3e-3)


def test_auto_never_predicted_worse_than_uniform_chunks():
    model = QuadraticLatencyModel(5e-8, 3.3e-4, 0.01, 1e-5)  # fitted on this box's pp = 2 traces
    planner = AutoChunkPlanner(2048, max_chunk_size=16384, prior=model)
    for pp in (2, 4):
        plan = planner.plan_chunks(16384, pp)
        for size in (512, 1024, 2048, 4096, 8192):
            uniform = [size] * (16384 // size)
            assert planner.predict_ttft(plan, pp) <= planner.predict_ttft(uniform, pp) + 1e-12


def test_a_prompt_follows_the_plan_made_at_its_first_chunk():
    planner = AutoChunkPlanner(4096, max_chunk_size=16384, prior=TRUE)
    plan = planner.plan_chunks(131_072, 4)
    got, done = [], 0
    while done < 131_072:
        x = planner.chunk_budget(131_072, done, 4)
        assert planner.chunk_budget(131_072, done, 4) == x  # asking twice in a pass: same answer
        got.append(x)
        planner.observe(done, x, TRUE.scaled(1.5).chunk_latency(done, x))  # the model moves meanwhile
        done += x
    assert got == plan
    # a prefix that is no boundary of the kept plan (radix hit, chunk cut short) plans afresh
    assert planner.chunk_budget(131_072, 1000, 4) == planner.plan_chunks(131_072, 4, 1000)[0]


def _cpu_auto_args(chunk: int, page: int) -> SimpleNamespace:
    """Server args of `--dynamic-chunking-mode auto` at pp 2 on CPU."""
    return SimpleNamespace(
        enable_dynamic_chunking=False,
        dynamic_chunking_mode="auto",
        pp_size=2,
        chunked_prefill_size=chunk,
        page_size=page,
        max_prefill_tokens=16384,
        pp_async_batch_depth=0,
        device="cpu",
    )


def test_auto_aligns_to_the_platform_attention_tile():
    from sglang.srt.platforms import get_platform

    assert get_platform("cpu").prefill_chunk_alignment == 512
    planner = build_chunk_policy(_cpu_auto_args(chunk=4096, page=16))
    assert planner.alignment == 512 and planner.body_floor == 1024  # 768 rounded up to the tile
    planner.set_prior(TRUE)
    plan = planner.plan_chunks(100_000, 4)
    assert sum(plan) == 100_000 and all(x % 512 == 0 for x in plan[:-1])
    assert AutoChunkPlanner(4096, page_size=1024, min_alignment=512).alignment == 1024  # lcm with the page


def test_small_chunk_size_keeps_small_chunks_on_cpu():
    planner = build_chunk_policy(_cpu_auto_args(chunk=256, page=1))
    assert planner.alignment == 64 and planner.body_floor == 64
