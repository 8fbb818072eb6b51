"""HiCache's storage prefetch (--hicache-storage-prefetch-policy) through the in-process scheduler
(tiny Llama, dummy float32 weights, one thread): a scheduler restarted on a file directory reads
the stored prefixes in the background. Each policy gives the tokens of a scheduler without
HiCache; `wait_complete` loads every stored page (prefill = suffix only); a backend whose reads
are held back (a real `FileStorage` whose `get` waits on a gate the test opens) blocks neither
the scheduler under `best_effort` nor, under `wait_complete`, the other requests; an abort or a
flush while a read is in flight leaves the host tier and the KV pool back at their free counts;
a corrupted page is counted as a failed prefetch and recomputed. No timing is asserted: the gate
decides what the I/O thread has done when."""

from __future__ import annotations

import os
import threading

import pytest
from test_hicache_scheduler import assert_pools_free, make, multi_turn, run

from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler.scheduler import Scheduler
from sglang.srt.mem_cache.hicache.file_storage import FileStorage
from sglang.srt.mem_cache.hicache.prefetch import PrefetchConfig
from sglang.srt.sampling.sampling_params import SamplingParams

POLICIES = ["best_effort", "wait_complete", "timeout"]


class GatedStorage(FileStorage):
    """A file backend whose reads wait until the test opens `gate` (a slow or stuck backend)."""

    def __init__(self, directory: str, namespace: str, page_size: int):
        super().__init__(directory, namespace, page_size)
        self.gate = threading.Event()
        self.entered = threading.Event()  # a read is waiting at the gate

    def get(self, name: str):
        self.entered.set()
        self.gate.wait()
        return super().get(name)


def gate_storage(sched: Scheduler) -> GatedStorage:
    """Swap the scheduler's file backend for a gated one over the same pages."""
    tree = sched.cache.tree
    gated = GatedStorage(tree.storage.directory, tree.storage.namespace, tree.storage.page_size)
    tree.storage = tree.prefetcher.reader.storage = gated
    return gated


def host_consistent(sched: Scheduler) -> bool:
    """Every used host row belongs to a tree node (no prefetch rows left behind)."""
    tree = sched.cache.tree
    return tree.host.size - tree.host.available_size() == tree.host_size()


def submit(sched: Scheduler, rid: str, prompt: list[int], new: int = 4) -> None:
    params = SamplingParams(max_new_tokens=new, temperature=0.0, ignore_eos=True)
    sched.handle_message(TokenizedGenerateReqInput(rid, None, prompt, params))


def collect(outs: dict, out) -> None:
    if out is not None:
        for j, rid in enumerate(out.rids):
            outs.setdefault(rid, []).extend(out.new_output_ids[j])


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Prompts, the tokens of a scheduler without HiCache, and a directory holding their pages."""
    d = str(tmp_path_factory.mktemp("kv"))
    prompts = multi_turn(convs=2, turns=1, first=60, step=4)
    expected = run(make(False), prompts, "a")
    assert run(make(True, d, page_size=4), prompts, "a") == expected
    return prompts, expected, d


def suffix_tokens(prompts) -> int:
    return sum(len(p) - (len(p) - 1) // 8 * 8 for p in prompts)  # after the whole 8-token pages


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_gives_the_same_tokens(stored, policy):
    prompts, expected, d = stored
    sched = make(True, d, page_size=4, prefetch=policy)
    assert run(sched, prompts, "a") == expected
    state = sched.internal_state()
    total = sum(len(p) for p in prompts)
    hits = state["hicache_l1_hit_tokens"] + state["hicache_l2_hit_tokens"] + state["hicache_l3_hit_tokens"]
    assert state["prefill_tokens_computed"] + hits == total
    assert state["hicache_prefetch_started"] == len(prompts)
    assert state["hicache_prefetch_hit_tokens"] == state["hicache_l3_hit_tokens"]
    if policy == "wait_complete":  # every stored page loaded, only the suffixes computed
        assert state["prefill_tokens_computed"] == suffix_tokens(prompts)
        assert state["hicache_prefetch_pages"] == (total - suffix_tokens(prompts)) // 8
    assert_pools_free(sched)
    assert host_consistent(sched)
    sched.cache.tree.close()


def with_timeout(sched: Scheduler, base: float) -> Scheduler:
    """The `timeout` policy with a bound of `base` seconds (prefetch_timeout_base; 0 per Ki token)."""
    sched.cache.tree.prefetcher.config = PrefetchConfig("timeout", base, 0.0)
    return sched


@pytest.mark.parametrize("policy", ["best_effort", "timeout_passed"])
def test_best_effort_never_waits_for_a_stuck_backend(stored, policy):
    """best_effort, and timeout once its bound has passed (0 s here), admit with what arrived."""
    prompts, expected, d = stored
    sched = make(True, d, page_size=4, prefetch=policy.removesuffix("_passed"))
    if policy == "timeout_passed":
        with_timeout(sched, 0.0)
    gated = gate_storage(sched)
    out = run(sched, prompts[:1], "a")  # the reads are held: the whole prompt is computed
    assert out == {"a0": expected["a0"]}
    state = sched.internal_state()
    assert state["prefill_tokens_computed"] == len(prompts[0])
    assert state["hicache_l3_hit_tokens"] == 0 and state["hicache_prefetch_started"] == 1
    assert_pools_free(sched)
    gated.gate.set()
    sched.cache.tree.close()  # the held read ends, its rows are freed
    assert host_consistent(sched)


@pytest.mark.parametrize("policy", ["wait_complete", "timeout_far"])
def test_wait_complete_holds_only_its_request(stored, policy):
    """wait_complete, and timeout before its bound (an hour here), hold the request until the read
    ends; another request runs meanwhile."""
    prompts, expected, d = stored
    sched = make(True, d, page_size=4, prefetch=policy.removesuffix("_far"))
    if policy == "timeout_far":
        with_timeout(sched, 3600.0)
    gated = gate_storage(sched)
    submit(sched, "a0", prompts[0])
    # two pages' worth, none stored (a token of its own per case: the directory is shared): the
    # probe finds nothing, no prefetch
    submit(sched, "other", [7 + len(policy)] * 20)
    outs: dict = {}
    for _ in range(500):  # bounded: a held request must not hold the others
        collect(outs, sched.step())
        if len(outs.get("other", [])) == 4:
            break
    assert len(outs.get("other", [])) == 4
    assert "a0" not in outs and [r.rid for r in sched.waiting] == ["a0"]  # still waiting
    assert gated.entered.wait(timeout=60)  # its read is (or gets) held at the gate
    gated.gate.set()
    for out in sched.run_until_idle(max_steps=10_000):
        collect(outs, out)
    assert outs["a0"] == expected["a0"]
    state = sched.internal_state()
    stored_tokens = (len(prompts[0]) - 1) // 8 * 8
    assert state["hicache_l3_hit_tokens"] == stored_tokens
    assert state["prefill_tokens_computed"] == 20 + len(prompts[0]) - stored_tokens
    assert state["hicache_prefetch_started"] == 1
    assert state["hicache_prefetch_wait_seconds"] > 0
    assert_pools_free(sched)
    assert host_consistent(sched)
    sched.cache.tree.close()


@pytest.mark.parametrize("then", ["next_request", "flush"])
def test_abort_during_prefetch_releases_everything(stored, then):
    prompts, expected, d = stored
    sched = make(True, d, page_size=4, prefetch="wait_complete")
    tree = sched.cache.tree
    gated = gate_storage(sched)
    submit(sched, "a0", prompts[0])
    sched.step()
    assert gated.entered.wait(timeout=60)
    assert tree.host.available_size() < tree.host.size  # rows held for the read in flight
    sched.handle_message(AbortReq("a0"))
    assert not sched.waiting and tree.protected_size() == 0  # the matched path is unlocked
    if then == "flush":
        threading.Timer(0.05, gated.gate.set).start()  # flush waits for the thread to let go
        assert sched.flush_cache().success
        assert tree.host.available_size() == tree.host.size
    else:
        gated.gate.set()
        assert run(sched, prompts[1:], "a") == {"a0": expected["a1"]}  # rid reused: a1's prompt
    assert_pools_free(sched)
    assert host_consistent(sched)
    tree.close()


def test_corrupted_page_fails_the_prefetch_and_recomputes(stored, tmp_path):
    prompts, expected, d = stored
    copy = str(tmp_path / "kv")
    os.system(f"cp -r {d} {copy}")
    for root, _, files in os.walk(copy):
        for f in files:
            with open(os.path.join(root, f), "r+b") as fh:
                fh.seek(-1, 2)
                last = fh.read(1)[0]
                fh.seek(-1, 2)
                fh.write(bytes([last ^ 0x5A]))
    sched = make(True, copy, page_size=4, prefetch="wait_complete")
    assert run(sched, prompts, "a") == expected
    state = sched.internal_state()
    assert state["hicache_prefetch_failures"] == len(prompts)
    assert state["hicache_storage_read_failures"] >= len(prompts)
    assert state["hicache_l3_hit_tokens"] == 0
    assert state["prefill_tokens_computed"] == sum(len(p) for p in prompts)
    assert_pools_free(sched)
    assert host_consistent(sched)
    sched.cache.tree.close()


def test_prefetch_where_ranks_can_agree(tmp_path):
    """A rank alone prefetches, and so do tp / cp peers that can gather every rank's counts and a
    pipeline's stage 0; peers with only `agree` keep the synchronous L3 load: no prefetch is
    started and every request is ready at once. A pipeline tree that could not prefetch is refused
    (its later stages would never read their pages)."""
    import torch

    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.hicache.hiradix_cache import HiRadixCache
    from sglang.srt.mem_cache.hicache.host_pool import HostKVPool, kv_token_buffers
    from sglang.srt.mem_cache.hicache.pipeline import RingPeers
    from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool

    pool = MHATokenToKVPool(16, 2, torch.float32, head_num=2, head_dim=4, layer_num=2)
    host = HostKVPool(kv_token_buffers(pool), 32, 2)
    storage = FileStorage(str(tmp_path), "ns", 4)
    config = PrefetchConfig("wait_complete")

    def tree(agree=None, gather=None):
        return HiRadixCache(
            TokenToKVPoolAllocator(16, 2), 2, host, "write_through", storage, agree, config, gather
        )

    gather = lambda values: [list(values), list(values)]  # noqa: E731
    piped = tree()
    piped.enable_pipeline(RingPeers(None))
    for prefetching in (tree(), tree(min, gather), piped):
        assert prefetching.wants_prefetch("r") and not prefetching.prefetch_ready("r")  # waits
    sync = tree(min)
    assert not sync.wants_prefetch("r") and sync.prefetch_ready("r")
    with pytest.raises(ValueError, match="pipeline"):
        sync.enable_pipeline(RingPeers(None))


def test_bad_prefetch_timeout_refused_by_name():
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path="m",
        load_format="dummy",
        enable_hierarchical_cache=True,
        hicache_storage_backend="file",
        hicache_storage_prefetch_policy="timeout",
        hicache_storage_backend_extra_config='{"prefetch_timeout_base": -1}',
    )
    with pytest.raises(ValueError, match="prefetch_timeout_base"):
        args.validate()
