"""HiCache storage prefetch, what one prefetch costs and who counts what (in-process scheduler, tiny
Llama, dummy float32 weights): the storage counters stay exact when the I/O thread and the
scheduler thread move them at once, and a failure one thread meets is never blamed on the other's
call; an admission walks the radix tree once; a long prompt whose stored prefix is short reserves
host rows (and hashes pages) only for about what is stored."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest
from test_hicache_prefetch import GatedStorage, gate_storage, host_consistent, stored, submit  # noqa: F401
from test_hicache_scheduler import TINY, assert_pools_free, make

from sglang.srt.mem_cache.hicache import page_store
from sglang.srt.mem_cache.hicache.file_storage import FileStorage
from sglang.srt.managers.scheduler.scheduler import Scheduler
from sglang.srt.server_args import ServerArgs


def corrupt_pages(storage: FileStorage, tag: str, n: int) -> list[str]:
    """`n` stored pages that fail their checksum (each read of one is a counted failure)."""
    names = [f"{tag}{i:04d}" + "0" * 56 for i in range(n)]
    for name in names:
        assert storage.put(name, b"payload")
        with open(storage._path(name), "r+b") as f:
            f.seek(-1, 2)
            f.write(b"X")
    return names


def test_counters_add_up_across_threads(tmp_path):
    """Two threads failing reads at once (the I/O thread and a scheduler-side load): every failure
    is counted. The counter's read is slowed so that an unlocked read-modify-write would interleave."""
    storage = FileStorage(str(tmp_path), "ns", 4)
    stats_type = type(storage.stats)

    class SlowRead(stats_type):
        def __getattribute__(self, name):
            value = super().__getattribute__(name)
            if name == "read_failures":
                time.sleep(0.0005)  # between reading the counter and writing it back
            return value

    storage.stats = SlowRead()
    per_thread = 40
    names = [corrupt_pages(storage, t, per_thread) for t in ("a", "b")]
    threads = [threading.Thread(target=lambda ns=ns: [storage.get(n) for n in ns]) for ns in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert storage.stats.read_failures == 2 * per_thread


class ProbeRacesAFailure(FileStorage):
    """While the scheduler probes (`exists`), the I/O thread's side fails a read of its own."""

    bad: list[str] = []

    def exists(self, name: str) -> bool:
        if self.bad:
            t = threading.Thread(target=self.get, args=(self.bad.pop(),))
            t.start()
            t.join()
        return super().exists(name)


def test_probe_is_not_blamed_for_another_threads_failure(tmp_path):
    sched = make(True, str(tmp_path), page_size=4, prefetch="wait_complete")
    tree = sched.cache.tree
    racing = ProbeRacesAFailure(tree.storage.directory, tree.storage.namespace, tree.storage.page_size)
    racing.bad = corrupt_pages(racing, "c", 1)
    tree.storage = tree.prefetcher.reader.storage = racing
    submit(sched, "r", [5] * 20)  # two storage pages, none stored: nothing to prefetch
    sched.step()
    state = sched.internal_state()
    assert state["hicache_storage_read_failures"] == 1  # the other thread's failure is counted...
    assert state["hicache_prefetch_failures"] == 0  # ...but the probe met none
    sched.run_until_idle()
    tree.close()


def count_walks(tree) -> list:
    """Wrap `tree.match_and_load` to record how many tree walks each admission makes."""
    walks, inner_walk, inner_load = [], tree._walk, tree.match_and_load
    calls = [0]

    def walk(key):
        calls[0] += 1
        return inner_walk(key)

    def load(key, rid=None):
        calls[0] = 0
        out = inner_load(key, rid)
        walks.append(calls[0])
        return out

    tree._walk, tree.match_and_load = walk, load
    return walks


@pytest.mark.parametrize("prefetch", [True, False])
def test_admission_walks_the_tree_once(stored, prefetch):
    """An admission whose prefetch landed (or, synchronously, whose L3 pages load then) walks once."""
    prompts, expected, d = stored
    sched = make(True, d, page_size=4, prefetch="wait_complete")
    tree = sched.cache.tree
    if not prefetch:
        tree.prefetcher = None  # the synchronous L3 load at admission
    walks = count_walks(tree)
    submit(sched, "a0", prompts[0])
    outs = {}
    for out in sched.run_until_idle(max_steps=10_000):
        for j, rid in enumerate(out.rids):
            outs.setdefault(rid, []).extend(out.new_output_ids[j])
    assert outs["a0"] == expected["a0"]
    assert sched.internal_state()["hicache_l3_hit_tokens"] == (len(prompts[0]) - 1) // 8 * 8
    assert walks == [1]
    assert_pools_free(sched)
    tree.close()


class CountingHashlib:
    """page_store's `hashlib`, counting the sha256 objects made (one per page hashed)."""

    def __init__(self):
        self.count = 0

    def sha256(self, data=b""):
        self.count += 1
        return hashlib.sha256(data)


def make_roomy(directory: str) -> Scheduler:
    """`make(True, directory, page_size=4)` with a KV pool of 512 tokens (a 40-page prompt fits)."""
    storage = {"file_path": directory, "page_tokens": 8}
    args = ServerArgs(
        **TINY,
        max_total_tokens=512,
        chunked_prefill_size=64,
        page_size=4,
        enable_hierarchical_cache=True,
        hicache_ratio=2.0,
        hicache_storage_backend="file",
        hicache_storage_prefetch_policy="wait_complete",
        hicache_storage_backend_extra_config=json.dumps(storage),
    )
    args.validate()
    return Scheduler(args)


def test_long_prompt_with_a_short_stored_prefix_reserves_little(stored, monkeypatch):
    """A prompt of 40 storage pages whose first 2 are stored (and the thread held at the gate):
    host rows are reserved for those 2 pages only, and far fewer than 40 pages are hashed."""
    prompts, _, d = stored
    sched = make_roomy(d)
    tree = sched.cache.tree
    gated = gate_storage(sched)
    prompt = prompts[0][:16] + [9] * (40 * 8 - 16)
    counting = CountingHashlib()
    monkeypatch.setattr(page_store, "hashlib", counting)
    submit(sched, "long", prompt, new=1)
    sched.step()
    monkeypatch.setattr(page_store, "hashlib", hashlib)
    assert tree.host.size - tree.host.available_size() == 16  # two pages' rows, not the prompt's
    assert 2 <= counting.count <= 20
    assert gated.entered.wait(timeout=60)  # the prefetch started, its read held
    gated.gate.set()
    sched.run_until_idle(max_steps=10_000)
    state = sched.internal_state()
    assert state["hicache_prefetch_pages"] == 2 and state["hicache_l3_hit_tokens"] == 16
    assert_pools_free(sched)
    tree.close()
    assert host_consistent(sched)
