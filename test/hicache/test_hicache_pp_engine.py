"""HiCache through the whole engine at pp 2 (one scheduler process per stage, gloo): stage 0's tree
decides, each stage copies its own layers between the tiers (mem_cache/hicache/pipeline.py).

- A multi-turn workload whose KV is several times the KV pool gives the greedy tokens of pp 1
  without HiCache; a new engine on the same file directory loads each prompt's prefix from storage
  on both stages (cached = every whole storage page of the prompt, computed = the suffix only).
- pp 2 × tp 2: the same restart, each of the four ranks loading its own pages.
- One stage's pages corrupted (each stage in turn): the whole pipeline recomputes, the
  tokens still match and the bad pages are counted (stage 0's own read failures, or the ones the
  later stage met while answering stage 0's query).
"""

from __future__ import annotations

import os
import shutil

import pytest
from engine_helpers import POOL, check_restart, conversation_turns, run_engine

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

STORAGE_PAGE = 8


def prompts() -> list[list[int]]:
    return [p for wave in conversation_turns(seed=7, convs=3) for p in wave]


def run(pp: int, hicache_dir=None, ps=None, **kw) -> tuple[list[list[int]], list[int], dict]:
    """(output ids, cached tokens per prompt, stage 0's internal state), one prompt at a time."""
    waves = [[p] for p in ps or prompts()]
    outs, cached, states = run_engine(waves, hicache_dir, STORAGE_PAGE, pp_size=pp, **kw)
    return outs, cached, states[0]


def namespaces(directory: str) -> list[str]:
    """The namespace folders (one per stage) of a file-backend directory."""
    return sorted(os.path.join(directory, d) for d in os.listdir(directory))


def corrupt(folder: str) -> int:
    n = 0
    for root, _, files in os.walk(folder):
        for f in files:
            with open(os.path.join(root, f), "r+b") as fh:
                fh.seek(-1, os.SEEK_END)
                last = fh.read(1)
                fh.seek(-1, os.SEEK_END)
                fh.write(bytes([last[0] ^ 0xFF]))
            n += 1
    return n


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    assert sum(len(p) for p in prompts()) > 3 * POOL
    return run(1)[0]


def test_pp2_hicache_matches_and_restarts_from_files(tmp_path, reference):
    ps = prompts()
    d = str(tmp_path / "kv")
    got, _, state = run(2, d)
    assert got == reference
    assert (
        state["hicache_l2_hit_tokens"] > 0 and state["available_kv_tokens"] == state["max_total_num_tokens"]
    )
    assert len(namespaces(d)) == 2  # each stage wrote its own layers' pages
    # a restarted server: empty L1 and L2 on both stages, the files remain; only the first prompt
    # of each conversation (its L1/L2 empty) can show the L3 prefix alone
    first = ps[:3]
    again, cached, state = run(2, d, first)
    assert again == reference[:3]
    assert cached == [(len(p) - 1) // STORAGE_PAGE * STORAGE_PAGE for p in first]
    assert state["prefill_tokens_computed"] == sum(len(p) - c for p, c in zip(first, cached))
    assert state["hicache_l3_hit_tokens"] == sum(cached) and state["hicache_peer_missing_pages"] == 0
    assert state["hicache_storage_read_failures"] == 0
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]


def test_pp2_corrupt_stage_pages_recompute(tmp_path, reference):
    ps = prompts()[:3]
    written = str(tmp_path / "kv")
    assert run(2, written, ps)[0] == reference[:3]
    own = peer = 0
    for which in (0, 1):  # one stage's pages bad (each stage once, in a copy), the other's fine
        d = shutil.copytree(written, str(tmp_path / f"kv{which}"))
        assert corrupt(namespaces(d)[which]) > 0
        got, cached, state = run(2, d, ps)
        assert got == reference[:3]
        assert cached == [0, 0, 0] and state["hicache_l3_hit_tokens"] == 0
        assert state["prefill_tokens_computed"] == sum(len(p) for p in ps)
        assert state["available_kv_tokens"] == state["max_total_num_tokens"]
        own += state["hicache_storage_read_failures"] > 0
        peer += state["hicache_peer_read_failures"] > 0 and state["hicache_peer_missing_pages"] > 0
    assert own == 1 and peer == 1  # stage 0's own pages once, stage 1's (found by the query) once


def test_pp2_tp2_restart_loads_on_every_rank(tmp_path, reference):
    """pp 2 × tp 2: every rank of stage 0 asks the ring, the entry rank gets the answer (the last
    stage's tp ranks agree first) and shares it; each of the four ranks loads its own pages."""
    ps = prompts()[:3]
    d = str(tmp_path / "kv")
    assert run(2, d, ps, tp_size=2)[0] == reference[:3]
    assert len(namespaces(d)) == 4
    again, cached, state = run(2, d, ps, tp_size=2)
    check_restart(ps, reference[:3], again, cached, state, STORAGE_PAGE)
