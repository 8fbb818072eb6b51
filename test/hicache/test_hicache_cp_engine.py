"""HiCache through the whole engine at cp 2 (context parallelism: the tree and allocators work in
virtual slots, each rank stores its share of every page, in its tiers and in its own storage
namespace, which names the cp layout): a multi-turn workload whose KV is several times the pool
gives the greedy tokens of one rank without HiCache; a restarted engine prefetches each prompt's
prefix from storage on both ranks (each rank's I/O thread reads its share) and computes only the
suffix; the same at pp 2 × cp 2 (synchronous L3 loads there)."""

from __future__ import annotations

import os

import pytest
from engine_helpers import POOL, check_restart, conversation_turns, run_engine

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

STORAGE_PAGE = 8  # a multiple of the virtual page (page 4 × cp 2)


def prompts() -> list[list[int]]:
    return [p for wave in conversation_turns(seed=11, convs=3) for p in wave]


def run(cp: int, hicache_dir=None, ps=None, **kw):
    if cp > 1:
        kw["cp_size"] = cp
    outs, cached, states = run_engine([[p] for p in ps or prompts()], hicache_dir, STORAGE_PAGE, **kw)
    return outs, cached, states[0]


@pytest.fixture(scope="module")
def ref() -> list[list[int]]:
    return run(1)[0]


def test_cp2_hicache_matches_and_restarts_from_files(tmp_path, ref):
    ps = prompts()
    assert sum(len(p) for p in ps) > 3 * POOL
    d = str(tmp_path / "kv")
    got, _, state = run(2, d)
    assert got == ref
    assert (
        state["hicache_l2_hit_tokens"] > 0 and state["available_kv_tokens"] == state["max_total_num_tokens"]
    )
    assert len(os.listdir(d)) == 2  # each cp rank wrote its share of the pages
    first = ps[:3]
    again, cached, state = run(2, d, first)
    assert again == ref[:3]
    assert cached == [(len(p) - 1) // STORAGE_PAGE * STORAGE_PAGE for p in first]
    assert state["prefill_tokens_computed"] == sum(len(p) - c for p, c in zip(first, cached))
    assert state["hicache_storage_read_failures"] == 0
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
    # the pages came through the storage prefetch, read by each cp rank's own thread
    assert state["hicache_l3_hit_tokens"] == state["hicache_prefetch_hit_tokens"] == sum(cached)
    assert state["hicache_prefetch_pages_by_rank"] == [state["hicache_prefetch_pages"]] * 2


def test_pp2_cp2_restart_loads_on_every_rank(tmp_path, ref):
    """pp 2 × cp 2: each stage's cp ranks hold their share of their layers; after a restart every
    one of the four ranks loads its own pages of each prefix (the later stage's cp ranks agree on
    the count before answering stage 0)."""
    ps = prompts()[:3]
    d = str(tmp_path / "kv")
    assert run(2, d, ps, pp_size=2)[0] == ref[:3]
    assert len(os.listdir(d)) == 4
    again, cached, state = run(2, d, ps, pp_size=2)
    check_restart(ps, ref[:3], again, cached, state, STORAGE_PAGE)
