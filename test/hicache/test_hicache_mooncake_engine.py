"""HiCache with the `mooncake` storage backend through the whole engine (tiny Llama, float32),
against a real `mooncake_master` started here: a second engine sharing the first one's store
loads every prefix from the first one's pages (prefill computes only the suffixes) with the
greedy tokens of an engine without HiCache; at tp 2 both ranks load their heads back from the
store after a flush; at pp 2 and cp 2 a restarted engine loads each rank's pages from the store; the master killed before a load: the request is
recomputed (same tokens), the failure counted, the KV pool back to its free count."""

from __future__ import annotations

import pytest
from engine_helpers import GREEDY, check_restart, conversation_turns, run_engine, tiny_engine

pytest.importorskip("mooncake.store")  # the `pd` extra

from mooncake_helpers import MooncakeMaster  # noqa: E402

pytestmark = pytest.mark.slow  # builds engines

STORAGE_PAGE = 8


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    m = MooncakeMaster(tmp_path_factory.mktemp("mooncake"))
    service = m.store_service()  # the store's memory: the engines lend none (pages outlive them)
    yield m
    service.close()
    m.kill()


def prompts() -> list[list[int]]:
    return [p for wave in conversation_turns(seed=11, convs=3) for p in wave]


def mooncake_args(m: MooncakeMaster) -> dict:
    return dict(
        enable_hierarchical_cache=True,
        hicache_storage_backend="mooncake",
        hicache_storage_prefetch_policy="wait_complete",  # tp 1: every stored page before admission
        hicache_storage_backend_extra_config=m.extra_config(STORAGE_PAGE),
    )


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    return run_engine([[p] for p in prompts()])[0]  # no HiCache


def test_second_engine_loads_the_first_engines_pages(master, reference):
    ps = prompts()
    first, _, states = run_engine([[p] for p in ps], **mooncake_args(master))
    assert first == reference
    assert states[0]["hicache_storage_pages_written"] >= sum(len(p) // STORAGE_PAGE for p in ps[:3])
    assert states[0]["hicache_storage_write_failures"] == 0
    # another server on the same store: nothing in its KV pool or host tier
    again, cached, states = run_engine([[p] for p in ps], **mooncake_args(master))
    state = states[0]
    check_restart(ps, reference, again, cached, state, STORAGE_PAGE)
    # the first turns' prefixes can come from the store only (the last token is always computed)
    assert state["hicache_l3_hit_tokens"] >= sum((len(p) - 1) // STORAGE_PAGE * STORAGE_PAGE for p in ps[:3])
    assert state["hicache_storage_read_failures"] == 0 and state["hicache_storage_unreachable"] == 0


def test_tp2_ranks_load_their_heads_from_the_store(master, reference):
    """tp 2: each rank a client of the store with its own namespace (its heads); after a flush
    both ranks load the same pages back and the tokens are tp 1's without HiCache."""
    ps = prompts()[:3]
    with tiny_engine(tp_size=2, **mooncake_args(master)) as llm:
        first = [llm.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in ps]
        assert llm.flush_cache().success  # L1 and L2 emptied on both ranks
        again = [llm.generate(input_ids=p, sampling_params=GREEDY) for p in ps]
        state = llm.get_server_info()["internal_states"][0]
    assert first == reference[:3] == [r["output_ids"] for r in again]
    whole_pages = [(len(p) - 1) // STORAGE_PAGE * STORAGE_PAGE for p in ps]
    assert [r["meta_info"]["cached_tokens"] for r in again] == whole_pages
    assert state["hicache_l3_hit_tokens"] == sum(whole_pages) and state["hicache_storage_read_failures"] == 0


@pytest.mark.parametrize("layout", [dict(pp_size=2), dict(cp_size=2)], ids=["pp2", "cp2"])
def test_parallel_layout_restarts_from_the_store(master, reference, layout):
    """pp 2 (each stage a client with its layers' namespace; a prefix is skipped only where both
    stages read it) and cp 2 (each rank its share of the rows): a fresh engine of the same layout
    on the store loads every whole page of each prefix, the tokens are tp 1's without HiCache."""
    ps = prompts()[:3]
    # The engine is stopped right after the last answer: stage 1 replays the last prompt's tier
    # copies (writes its pages) before it exits on the SIGTERM (hicache_ring.StageHiCache).
    first, _, _ = run_engine([[p] for p in ps], **layout, **mooncake_args(master))
    assert first == reference[:3]
    again, cached, states = run_engine([[p] for p in ps], **layout, **mooncake_args(master))
    check_restart(ps, reference[:3], again, cached, states[0], STORAGE_PAGE)
    assert states[0]["hicache_storage_read_failures"] == 0


def test_master_killed_before_a_load_recomputes(tmp_path, reference):
    ps = prompts()
    m = MooncakeMaster(tmp_path)
    service = m.store_service()
    try:
        with tiny_engine(**mooncake_args(m)) as llm:
            first = [llm.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in ps[:3]]
            assert llm.get_server_info()["internal_states"][0]["hicache_storage_pages_written"] > 0
            service.close()
            m.kill()
            assert llm.flush_cache().success  # L1 and L2 emptied: the prefixes are in the store only
            again = [llm.generate(input_ids=p, sampling_params=GREEDY) for p in ps[:3]]
            state = llm.get_server_info()["internal_states"][0]
    finally:
        m.kill()
    assert first == reference[:3] == [r["output_ids"] for r in again]
    assert [r["meta_info"]["cached_tokens"] for r in again] == [0, 0, 0]  # recomputed
    assert state["hicache_l3_hit_tokens"] == 0 and state["hicache_storage_unreachable"] >= 1
    assert state["hicache_prefetch_failures"] >= 1  # tp 1: the prefetch's probe met the dead master
    assert state["prefill_tokens_computed"] == 2 * sum(len(p) for p in ps[:3])
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
