"""HiCache at tp 3 on SmolLM2-135M (9 query / 3 KV heads: one KV head per rank), real weights in
float32: a multi-turn workload whose KV is several times the KV pool gives the greedy tokens of
tp 1 without HiCache; a restarted tp 3 engine on the same file directory loads every prefix's
whole storage pages on all three ranks (each its own head's namespace) and computes only the
suffixes."""

from __future__ import annotations

import os

import pytest
from engine_helpers import POOL, check_restart, conversation_turns, run_engine

pytestmark = pytest.mark.slow  # three gloo ranks, real SmolLM2 weights

STORAGE_PAGE = 8


def run(tp: int, waves, hicache_dir=None) -> tuple[list[list[int]], list[int], dict]:
    from sglang.test.prompt_logprobs_reference import smollm2_hf_dir

    model = dict(model_path=smollm2_hf_dir(), load_format="auto", skip_tokenizer_init=True)
    outs, cached, states = run_engine(waves, hicache_dir, STORAGE_PAGE, tp_size=tp, **model)
    return outs, cached, states[0]


def test_tp3_smollm2_hicache_matches_and_restarts_from_files(tmp_path):
    waves = conversation_turns(seed=7, convs=3)
    ps = [p for wave in waves for p in wave]
    assert sum(len(p) for p in ps) > 3 * POOL
    ref, _, _ = run(1, waves)
    d = str(tmp_path / "kv")
    got, _, state = run(3, waves, d)
    assert got == ref
    assert (
        state["hicache_l2_hit_tokens"] > 0 and state["available_kv_tokens"] == state["max_total_num_tokens"]
    )
    assert state["hicache_storage_pages_written"] > 0 and len(os.listdir(d)) == 3  # a namespace per rank
    again, cached, state = run(3, [[p] for p in ps], d)  # a restarted server: empty L1 and L2
    check_restart(ps, ref, again, cached, state, STORAGE_PAGE)
