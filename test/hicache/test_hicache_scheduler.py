"""HiCache through the whole in-process scheduler (tiny Llama, dummy float32 weights, one thread):
a multi-turn workload whose KV is several times the KV pool gives the same greedy tokens with and
without HiCache under each write policy; a restarted scheduler on the same file directory loads
the repeated prefixes from storage and computes only the suffix; a corrupted page and a deleted
directory are recomputed with the same tokens. The counters read here are the scheduler's
internal state (/get_server_info)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from sglang.srt.managers.io_struct import AbortReq, ClearHiCacheReqInput, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.tiny_models import TINY_LLAMA_DIR

POOL = 128  # L1 tokens: the workload below holds ~4x this


# the tiny model as the other in-process scheduler tests run it
TINY = dict(model_path=str(TINY_LLAMA_DIR), load_format="dummy", dtype="float32", num_threads=1)


def make(
    hicache: bool, directory=None, policy="write_through", page_size=1, ratio=2.0, prefetch="wait_complete"
) -> Scheduler:
    """`prefetch`: the storage prefetch policy (wait_complete: every stored page is loaded)."""
    storage = {"file_path": directory, "page_tokens": 8} if directory else None
    args = ServerArgs(
        **TINY,
        max_total_tokens=POOL,
        chunked_prefill_size=64,
        page_size=page_size,
        enable_hierarchical_cache=hicache,
        hicache_write_policy=policy,
        hicache_ratio=ratio,
        hicache_storage_backend="file" if storage else "none",
        hicache_storage_prefetch_policy=prefetch,
        hicache_storage_backend_extra_config=json.dumps(storage) if storage else "",
    )
    args.validate()
    return Scheduler(args)


def run(sched: Scheduler, prompts: list[list[int]], tag: str) -> dict:
    """One request at a time (a conversation's turns arrive after the previous answer)."""
    outs: dict = {}
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
        sched.handle_message(TokenizedGenerateReqInput(f"{tag}{i}", None, prompt, params))
        for out in sched.run_until_idle():
            for j, rid in enumerate(out.rids):
                outs.setdefault(rid, []).extend(out.new_output_ids[j])
    return outs


def multi_turn(convs=4, turns=3, first=40, step=8) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    hist = [torch.randint(3, 500, (first,), generator=g).tolist() for _ in range(convs)]
    prompts = []
    for _ in range(turns):
        for k in range(convs):
            hist[k] = hist[k] + torch.randint(3, 500, (step,), generator=g).tolist()
            prompts.append(list(hist[k]))
    return prompts


def assert_pools_free(sched: Scheduler) -> None:
    state = sched.internal_state()
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
    assert state["free_req_slots"] == state["max_req_slots"]


@pytest.fixture(scope="module")
def workload():
    prompts = multi_turn()
    assert sum(len(p) for p in prompts) > 4 * POOL
    return prompts, run(make(False), prompts, "r")


@pytest.mark.parametrize("policy", ["write_through", "write_back", "write_through_selective"])
def test_greedy_tokens_match_with_host_tier(workload, policy):
    prompts, expected = workload
    sched = make(True, policy=policy)
    assert run(sched, prompts, "r") == expected
    state = sched.internal_state()
    if policy != "write_through_selective":  # selective copies only what was hit twice
        assert state["hicache_l2_hit_tokens"] > 0
    assert state["hicache_host_capacity"] == 2 * POOL
    assert_pools_free(sched)


def test_host_tier_saves_prefill(workload):
    prompts, _ = workload
    plain, hi = make(False), make(True, ratio=4.0)  # a host tier that holds the whole workload
    run(plain, prompts, "r")
    run(hi, prompts, "r")
    computed = hi.internal_state()["prefill_tokens_computed"]
    assert plain.internal_state()["prefill_tokens_computed"] > 2 * computed
    # every turn after the first computes only its 8 new tokens: its history comes from L1 or L2
    assert computed == sum(len(p) for p in prompts[:4]) + 8 * 8
    assert hi.internal_state()["hicache_l2_evicted_tokens"] == 0


def test_restart_loads_prefix_from_files_and_faults_recompute(tmp_path, workload):
    d = str(tmp_path / "kv")
    prompts = multi_turn(convs=2, turns=1, first=60, step=4)
    first = make(True, d, page_size=4)
    expected = run(first, prompts, "a")
    written = first.internal_state()
    assert written["hicache_storage_pages_written"] > 0
    assert 0 < written["hicache_storage_write_seconds"] <= written["hicache_backup_seconds"]
    restarted = make(True, d, page_size=4)
    assert run(restarted, prompts, "a") == expected
    state = restarted.internal_state()
    suffix = sum(len(p) - (len(p) - 1) // 8 * 8 for p in prompts)  # after the whole 8-token files
    assert state["hicache_l3_hit_tokens"] == sum(len(p) for p in prompts) - suffix
    assert state["prefill_tokens_computed"] == suffix  # only what follows the stored pages
    assert_pools_free(restarted)
    # a corrupted page: loads stop before it, the rest is recomputed, same tokens
    files = sorted(os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs)
    for path in files:
        with open(path, "r+b") as f:
            f.seek(-1, 2)
            last = f.read(1)[0]
            f.seek(-1, 2)
            f.write(bytes([last ^ 0x5A]))
    corrupted = make(True, d, page_size=4)
    assert run(corrupted, prompts, "a") == expected
    state = corrupted.internal_state()
    assert state["hicache_storage_read_failures"] >= 1 and state["hicache_l3_hit_tokens"] == 0
    assert_pools_free(corrupted)
    # the directory deleted under a running server (its L1 and L2 flushed): recomputed, written again
    assert corrupted.flush_cache().success
    shutil.rmtree(d)
    written = state["hicache_storage_pages_written"]
    assert run(corrupted, prompts, "b") == {k.replace("a", "b"): v for k, v in expected.items()}
    state = corrupted.internal_state()
    assert state["hicache_l3_hit_tokens"] == 0 and state["hicache_storage_pages_written"] > written
    assert os.path.isdir(d)
    assert_pools_free(corrupted)
    gone = make(True, d, page_size=4)
    shutil.rmtree(d)
    assert run(gone, prompts, "a") == expected and gone.internal_state()["hicache_l3_hit_tokens"] == 0
    assert_pools_free(gone)


def test_retractions_and_aborts_release_every_tier(workload):
    """All turns at once in a pool too small for them: requests are retracted (their KV goes back
    into the tree, its L2-only nodes adopt it) and re-admitted with loads; one is aborted."""
    prompts, _ = workload

    def burst(sched: Scheduler) -> dict:
        for i, prompt in enumerate(prompts[:6]):
            params = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
            sched.handle_message(TokenizedGenerateReqInput(f"q{i}", None, prompt, params))
        outs: dict = {}
        for out in sched.run_until_idle():
            for j, rid in enumerate(out.rids):
                outs.setdefault(rid, []).extend(out.new_output_ids[j])
        return outs

    plain, hi = make(False), make(True)
    run(hi, prompts[:4], "warm")  # the first turns' KV now sits in L1 and L2
    assert burst(hi) == burst(plain)
    assert hi.num_retractions > 0 and hi.internal_state()["hicache_l2_hit_tokens"] > 0
    assert_pools_free(hi)
    params = SamplingParams(max_new_tokens=50, temperature=0.0, ignore_eos=True)
    hi.handle_message(TokenizedGenerateReqInput("x", None, prompts[-1], params))
    hi.step()
    hi.handle_message(AbortReq("x"))
    hi.run_until_idle()
    assert_pools_free(hi)


def test_clear_storage_message(tmp_path):
    """ClearHiCacheReqInput (what /clear_hicache_storage_backend sends every rank): this rank's pages
    are deleted; refused where storage (or HiCache) is off."""
    d = str(tmp_path / "kv")
    sched = make(True, d, page_size=4)
    run(sched, multi_turn(convs=1, turns=1, first=40), "a")
    written = sched.internal_state()["hicache_storage_pages_written"]
    assert written > 0
    out = sched.handle_message(ClearHiCacheReqInput())
    assert out.success and f"{written} page(s)" in out.message
    assert not [f for _, _, fs in os.walk(d) for f in fs]
    for off in (make(True), make(False)):
        out = off.handle_message(ClearHiCacheReqInput())
        assert not out.success and "storage is off" in out.message
