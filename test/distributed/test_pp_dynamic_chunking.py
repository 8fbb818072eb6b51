"""Dynamic chunking in the real pipeline ring (spawned gloo ranks, float32, greedy).

- Start-up profiling runs on every stage's own model (a collective over the world); every rank
  fits on the merged numbers, so every rank ends with the same policy (ranks never diverge).
- pp = 2 with `--enable-dynamic-chunking` (upstream predictor) and with
  `--dynamic-chunking-mode auto` produces the same greedy tokens as pp = 1 with fixed chunks.
  For those runs the measured profile is replaced by a known latency curve (the real profiling
  still runs, on two lengths) so that the chunk sizes are predictable: the test checks from the
  PP trace that the chunks really shrink as the prefix grows (upstream) and that auto leaves no
  tail below C // 4.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.managers.pp.trace import merge_trace
from sglang.test.pp_harness import pp_rank_main, req, run_single_rank
from sglang.test.tiny_models import TINY_LLAMA_DIR, write_random_checkpoint

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

C = 256  # --chunked-prefill-size
LOGPROB_TOL = 1e-4
# Known per-stage latency curve f(l) = a·l² + b·l + c (seconds) used instead of the measured one.
CURVE = (1e-6, 1e-4, 1e-3)


def _curve_rank_main(rank: int, world_size: int, kwargs: dict, waves: list, curve: tuple) -> dict:
    """pp_rank_main with the profile replaced by `curve` (after a real two-length profile)."""
    import sglang.srt.managers.scheduler.chunk_profiler as profiler

    real = profiler.shared_profile

    def known_curve(runner, groups, lengths):
        real(runner, groups, lengths[:2])  # the real collective path, cheaply
        a, b, c = curve
        return [a * n * n + b * n + c for n in lengths]

    profiler.shared_profile = known_curve
    return pp_rank_main(rank, world_size, kwargs, waves)


def _policy_rank_main(rank: int, world_size: int, kwargs: dict) -> dict:
    """Build this rank's pipeline part (real profiling) and report its fitted policy."""
    from sglang.srt.distributed.parallel_state import ParallelGroups, ParallelLayout
    from sglang.srt.managers.pp.rank import build_pp_rank
    from sglang.srt.server_args import ServerArgs
    from sglang.test.pp_harness import ScriptedIO

    args = ServerArgs(**kwargs)
    layout = ParallelLayout.from_server_args(args)
    groups = ParallelGroups.build(layout, rank, "gloo")
    io = ScriptedIO([], None) if groups.is_entry_rank else None
    pp = build_pp_rank(args, groups, io=io)
    if io is not None:
        io.bind(pp.scheduler)
    policy = pp.chunk_policy
    state = {"type": type(policy).__name__, "plan_16k": policy.plan_chunks(16384) if policy else None}
    if hasattr(policy, "to_dict"):
        state["dict"] = policy.to_dict()
    state["budget_used_by_scheduler"] = (
        pp.scheduler is not None and pp.scheduler.policy.chunk_budget is not None
    )
    pp.run(stop=io.finished if io is not None else None)
    return state


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = str(write_random_checkpoint(TINY_LLAMA_DIR, tmp_path_factory.mktemp("llama"), seed=11))
    vocab = json.load(open(os.path.join(path, "config.json")))["vocab_size"]
    g = torch.Generator().manual_seed(3)
    prompt = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    long1 = prompt(1100)
    waves = [
        [req("long", long1, 6), req("odd", prompt(701), 6), req("short", prompt(9), 8)],
        [req("radix-extend", long1 + prompt(333), 5)],  # first chunk starts after a cached prefix
    ]
    base = dict(
        model_path=path,
        dtype="float32",
        num_threads=1,
        chunked_prefill_size=C,
        max_total_tokens=8192,
        log_level="warning",
    )
    ref = run_single_rank(base, waves)["outputs"]
    return base, waves, ref


def _check_same(ref: dict, got: dict) -> None:
    assert set(got) == set(ref)
    for rid, r in ref.items():
        g = got[rid]
        assert g.output_ids == r.output_ids, f"{rid}: greedy tokens differ"
        assert g.cached_tokens == r.cached_tokens, rid
        if r.logprobs:
            assert max(abs(a - b) for a, b in zip(r.logprobs, g.logprobs)) <= LOGPROB_TOL, rid


def _chunks(trace: str, rid: str) -> list[tuple[int, int]]:
    """(prefix_len, chunk_len) of the stage-0 forwards that ran a prefill chunk of `rid` alone."""
    events = merge_trace(trace)["traceEvents"]
    fwd = [e for e in events if e["ph"] == "X" and e["name"] == "forward" and e["pid"] == 0]
    return [
        (e["args"]["prefix_lens"][0], e["args"]["extend_lens"][0])
        for e in fwd
        if e["args"]["rids"] == [rid] and e["args"]["extend_lens"][0] > 1
    ]


@pytest.mark.parametrize("mode", ["upstream", "auto"])
def test_pp2_dynamic_chunking_parity(setup, tmp_path, mode):
    base, waves, ref = setup
    trace = str(tmp_path / f"{mode}.json")
    flags = {"enable_dynamic_chunking": True} if mode == "upstream" else {"dynamic_chunking_mode": "auto"}
    kwargs = {**base, **flags, "pp_size": 2, "pp_trace_path": trace}
    results = run_ranks(_curve_rank_main, 2, args=(kwargs, waves, CURVE), timeout=180)
    _check_same(ref, results[0]["outputs"])
    assert results[0]["state"]["available_kv_tokens"] == results[0]["state"]["max_total_num_tokens"]

    long_chunks = _chunks(trace, "long")
    assert sum(n for _, n in long_chunks) >= 1100 - C  # most of it ran alone (others may share a step)
    sizes = [n for _, n in long_chunks]
    if mode == "upstream":
        # the predictor: first chunk C, then shrinking multiples of 64 (never below C // 4)
        assert sizes[0] == C
        body = sizes[:-1]
        assert all(x % 64 == 0 and x >= C // 4 for x in body[1:]), str(long_chunks)
        assert body == sorted(body, reverse=True) and body[-1] < C, f"chunks did not shrink: {sizes}"
    else:
        assert all(x >= C // 4 for x in sizes), f"auto emitted a tail below C // 4: {sizes}"
        assert all(x % 64 == 0 for x in sizes[:-1]), sizes
    # the request behind a radix hit got its first chunk from the policy at its cached prefix
    ext = _chunks(trace, "radix-extend")
    assert ext and ext[0][0] >= 1024, ext


def test_every_rank_fits_the_same_policy(setup):
    """Real profiling on both stages of pp = 2 × tp = 2: all four ranks agree on the fit."""
    base, _, _ = setup
    kwargs = {
        **base,
        "pp_size": 2,
        "tp_size": 2,
        "enable_dynamic_chunking": True,
        "chunked_prefill_size": 128,
    }
    states = run_ranks(_policy_rank_main, 4, args=(kwargs,), timeout=180)
    assert all(s["type"] == "ChunkSizePredictor" for s in states)
    assert all(s == {**states[0], "budget_used_by_scheduler": s["budget_used_by_scheduler"]} for s in states)
    assert [s["budget_used_by_scheduler"] for s in states] == [True, True, False, False]
    assert sum(states[0]["plan_16k"]) == 16384


def test_flags_parse_and_validate():
    from sglang.srt.managers.dynamic_chunking import build_chunk_policy
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    args = prepare_server_args(
        ["--enable-dynamic-chunking", "--dynamic-chunking-mode", "auto", "--pp-size", "2"]
    )
    assert args.enable_dynamic_chunking and args.dynamic_chunking_mode == "auto"
    with pytest.raises(ValueError, match="dynamic-chunking-mode"):
        ServerArgs(dynamic_chunking_mode="fast").validate()
    assert (
        build_chunk_policy(ServerArgs(enable_dynamic_chunking=True, pp_size=1)) is None
    )  # warns, fixed chunks
