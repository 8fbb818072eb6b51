"""HiCache through the whole engine at tp 2 (one scheduler process per rank, gloo): a multi-turn
workload whose KV is several times the KV pool gives the greedy tokens of tp 1 without HiCache;
then a new engine on the same file directory loads the prefixes from storage on both ranks (the
ranks agree on how many pages they load) and computes only the suffix."""

from __future__ import annotations

import pytest
from engine_helpers import POOL, conversation_turns, run_engine

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines


def prompts() -> list[list[int]]:
    return [p for wave in conversation_turns(seed=5, convs=3) for p in wave]


def run(tp: int, hicache_dir=None) -> tuple[list[list[int]], dict]:
    outs, _, states = run_engine([[p] for p in prompts()], hicache_dir, tp_size=tp)
    return outs, states[0]


def test_tp2_hicache_matches_and_restarts_from_files(tmp_path):
    ps = prompts()
    assert sum(len(p) for p in ps) > 3 * POOL
    ref, _ = run(1)
    d = str(tmp_path / "kv")
    got, state = run(2, d)
    assert got == ref
    assert (
        state["hicache_l2_hit_tokens"] > 0 and state["available_kv_tokens"] == state["max_total_num_tokens"]
    )
    again, state = run(2, d)  # a restarted server: empty L1 and L2, the files remain
    assert again == ref
    assert state["hicache_l3_hit_tokens"] > 0 and state["hicache_storage_read_failures"] == 0
    assert state["prefill_tokens_computed"] < sum(len(p) for p in ps) // 2
