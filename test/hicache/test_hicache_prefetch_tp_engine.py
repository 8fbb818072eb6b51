"""HiCache's storage prefetch at tp 2 through the whole engine (one scheduler process per rank,
gloo; tiny Llama, dummy float32 weights): after a tp 2 engine wrote a multi-turn workload's pages,
a restarted tp 2 engine prefetches them (each rank's I/O thread reads its own namespace) under each
policy and gives the greedy tokens of tp 1 without HiCache; the pages landed are counted on every
rank (`hicache_prefetch_pages_by_rank`: what each rank's thread had read when they landed). A page
missing, or corrupt, on one rank's store only: every rank lands the same (shorter) run and
recomputes the rest, with the same tokens and no hang."""

from __future__ import annotations

import os

import pytest
from engine_helpers import check_restart, conversation_turns, run_engine

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

STORAGE_PAGE = 8


def prompts() -> list[list[int]]:
    return [p for wave in conversation_turns(seed=5, convs=3) for p in wave]


def run(tp: int, hicache_dir=None, **kw):
    outs, cached, states = run_engine([[p] for p in prompts()], hicache_dir, STORAGE_PAGE, tp_size=tp, **kw)
    return outs, cached, states[0]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The tokens of tp 1 without HiCache, and a directory a tp 2 engine wrote its pages to."""
    ref = run(1)[0]
    d = str(tmp_path_factory.mktemp("kv"))
    assert run(2, d)[0] == ref
    assert len(os.listdir(d)) == 2  # a namespace per rank
    return ref, d


def assert_prefetched_everywhere(state: dict, tp: int = 2) -> None:
    """Every L3 token came through a prefetch, and each rank's thread read at least the pages
    that landed (identical on every rank by construction)."""
    pages = state["hicache_prefetch_pages"]
    assert state["hicache_l3_hit_tokens"] == state["hicache_prefetch_hit_tokens"]
    assert len(state["hicache_prefetch_pages_by_rank"]) == tp
    assert all(read >= pages for read in state["hicache_prefetch_pages_by_rank"])


@pytest.mark.parametrize("policy", ["wait_complete", "timeout", "best_effort"])
def test_tp2_prefetch_each_policy(written, policy):
    ref, d = written
    ps = prompts()
    again, cached, state = run(2, d, hicache_storage_prefetch_policy=policy)
    assert again == ref
    assert state["hicache_prefetch_started"] > 0
    assert_prefetched_everywhere(state)
    if policy != "best_effort":  # an idle engine's reads end well within timeout's bound
        check_restart(ps, ref, again, cached, state, STORAGE_PAGE)
        assert state["hicache_prefetch_pages_by_rank"] == [state["hicache_prefetch_pages"]] * 2
        assert state["hicache_prefetch_pages"] > 0
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]


def damage_one_rank(src: str, dst: str, how: str) -> None:
    """Copy the pages, then remove (or corrupt) the first prompt's second page in one rank's
    namespace folder (pages are written in order: the second oldest file there)."""
    os.system(f"cp -r {src} {dst}")
    ns = sorted(os.listdir(src))[0]
    pages = [os.path.join(root, f) for root, _, files in os.walk(os.path.join(src, ns)) for f in files]
    victim = os.path.join(dst, os.path.relpath(sorted(pages, key=os.path.getmtime)[1], src))
    if how == "missing":
        os.remove(victim)
    else:
        with open(victim, "r+b") as f:
            f.seek(-1, 2)
            last = f.read(1)[0]
            f.seek(-1, 2)
            f.write(bytes([last ^ 0x5A]))


@pytest.mark.parametrize("how", ["missing", "corrupt"])
def test_tp2_page_bad_on_one_rank_is_recomputed_by_all(written, tmp_path, how):
    ref, d = written
    ps = prompts()
    clean = run(2, d)
    bad = str(tmp_path / "kv")
    damage_one_rank(d, bad, how)
    again, cached, state = run(2, bad)
    assert again == ref
    assert cached[0] == STORAGE_PAGE < clean[1][0]  # the first prompt: only the page before it
    assert cached[1:] == clean[1][1:]
    assert state["hicache_prefetch_pages"] < clean[2]["hicache_prefetch_pages"]
    assert_prefetched_everywhere(state)
    by_rank = state["hicache_prefetch_pages_by_rank"]
    if how == "missing":  # the ranks agree at the probe: each reads only the run both hold
        assert by_rank == [state["hicache_prefetch_pages"]] * 2
    else:  # both probe 5 pages; the damaged rank reads 1, the other 5, and both land 1
        assert min(by_rank) == state["hicache_prefetch_pages"] and max(by_rank) - min(by_rank) == 4
    assert state["prefill_tokens_computed"] == sum(len(p) - c for p, c in zip(ps, cached))
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
