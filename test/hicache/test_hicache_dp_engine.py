"""HiCache through the whole engine with attention DP (`--enable-dp-attention --dp-size 2`): each
replica has its own KV pool, host tier and tree; the replicas share the L3 directory (the storage
namespace holds what decides the KV bytes, not the replica). A multi-turn workload whose KV is
several times a replica's pool gives the greedy tokens of one rank without HiCache; a restarted
engine on the same directory loads every prompt's prefix from storage on whichever replica serves
it (pages one replica wrote are read by the other), and computes only the suffix."""

from __future__ import annotations

import os

import pytest
from engine_helpers import POOL, conversation_turns, run_engine

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

STORAGE_PAGE = 8


def turns() -> list[list[list[int]]]:
    """Three turns of four conversations, a turn as one batch (both replicas serve it)."""
    return conversation_turns(seed=9, convs=4, base=48)


def run(dp: int, hicache_dir=None, waves=None) -> tuple[list[list[int]], list[int], list[dict]]:
    """(output ids, cached tokens per prompt, each replica's internal state)."""
    kw = dict(tp_size=dp, dp_size=dp, enable_dp_attention=True) if dp > 1 else {}
    return run_engine(waves or turns(), hicache_dir, STORAGE_PAGE, **kw)


def total(states: list[dict], key: str) -> int:
    return sum(s[key] for s in states)


def test_dp_attention_hicache_matches_and_shares_storage(tmp_path):
    ps = [p for wave in turns() for p in wave]
    assert sum(len(p) for p in ps) > 2 * 2 * POOL  # several times both replicas' pools
    ref = run(1)[0]
    d = str(tmp_path / "kv")
    got, _, states = run(2, d)
    assert got == ref and len(states) == 2
    assert total(states, "hicache_l2_hit_tokens") > 0
    assert all(s["available_kv_tokens"] == s["max_total_num_tokens"] for s in states)
    assert len(os.listdir(d)) == 1  # one namespace: the replicas share their pages
    # a restarted engine: empty L1 / L2 on both replicas, the shared files remain; the last turn of
    # every conversation (one batch, spread over both replicas) loads its whole-page prefix from L3
    last = ps[-4:]
    again, cached, states = run(2, d, [last])
    assert again == ref[-4:]
    assert cached == [(len(p) - 1) // STORAGE_PAGE * STORAGE_PAGE for p in last]
    assert all(s["hicache_l3_hit_tokens"] > 0 for s in states)  # both replicas read shared pages
    assert total(states, "prefill_tokens_computed") == sum(len(p) - c for p, c in zip(last, cached))
    assert total(states, "hicache_storage_read_failures") == 0
    assert all(s["available_kv_tokens"] == s["max_total_num_tokens"] for s in states)


def test_pp2_dp_attention_hicache_restarts_from_storage(tmp_path):
    """pp 2 × attention DP 2 (four ranks): each replica's stage 0 keeps its tree and sends its own
    tier copies and storage queries down its ring column; a restarted engine loads every prompt's
    whole-page prefix on both stages of whichever replica serves it."""
    waves = turns()[:2]
    ps = [p for wave in waves for p in wave]
    ref = run(1, waves=waves)[0]
    d = str(tmp_path / "kv")
    kw = dict(tp_size=2, dp_size=2, enable_dp_attention=True, pp_size=2)
    got, _, states = run_engine(waves, d, STORAGE_PAGE, **kw)
    assert got == ref and len(states) == 2
    assert len(os.listdir(d)) == 2  # one namespace per stage, shared by the replicas
    last = ps[-4:]
    again, cached, states = run_engine([last], d, STORAGE_PAGE, **kw)
    assert again == ref[-4:]
    assert cached == [(len(p) - 1) // STORAGE_PAGE * STORAGE_PAGE for p in last]
    assert all(s["hicache_l3_hit_tokens"] > 0 for s in states)
    assert total(states, "hicache_peer_missing_pages") == 0
    assert total(states, "prefill_tokens_computed") == sum(len(p) - c for p, c in zip(last, cached))
    assert all(s["available_kv_tokens"] == s["max_total_num_tokens"] for s in states)
