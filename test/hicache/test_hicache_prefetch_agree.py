"""HiCache's storage prefetch agreement (tp / cp > 1), in process: the tree's `gather` is replaced
by a fake group of two ranks, this scheduler and a scripted peer whose I/O thread lags (not yet
finished, nothing read) and then stops short (one page read). Under `wait_complete` the request
waits while the peer has not finished although this rank's read ended; then every stored page this
rank read beyond the peer's count is dropped: one page lands (the minimum), the rest is
recomputed with the same greedy tokens, and every host row is back in the tree or free."""

from __future__ import annotations

from test_hicache_prefetch import collect, host_consistent, stored, submit  # noqa: F401
from test_hicache_scheduler import assert_pools_free, make


class LaggingPeer:
    """A second rank for `gather`: the same values as this rank, but for each prefetch poll (three
    ints per task in flight) it reports `lag` polls of 'not finished, nothing read, may not go',
    then 'finished, one page read'."""

    def __init__(self, lag: int):
        self.lag, self.polls = lag, 0

    def __call__(self, values: list[int]) -> list[list[int]]:
        peer = list(values)
        if len(values) >= 3:  # a poll with the request's task in flight
            self.polls += 1
            peer[:3] = [0, 0, 0] if self.polls <= self.lag else [1, min(1, values[1]), 1]
        return [list(values), peer]


def test_request_waits_for_the_slowest_rank_and_lands_its_count(stored):
    prompts, expected, d = stored
    sched = make(True, d, page_size=4, prefetch="wait_complete")
    tree = sched.cache.tree
    peer = LaggingPeer(lag=5)
    tree.gather = tree.prefetcher.gather = peer
    tree.agree = lambda n: n  # the peers' synchronous count (not used: every load is prefetched)
    submit(sched, "a0", prompts[0])
    outs: dict = {}
    for _ in range(5):
        collect(outs, sched.step())
        assert [r.rid for r in sched.waiting] == ["a0"]  # held: the peer has not finished
    task = tree.prefetcher.tasks["a0"]
    assert task.finished.wait(timeout=60)  # this rank's thread ends meanwhile
    for out in sched.run_until_idle(max_steps=10_000):
        collect(outs, out)
    assert outs["a0"] == expected["a0"]
    state = sched.internal_state()
    stored_pages = (len(prompts[0]) - 1) // 8
    assert state["hicache_prefetch_pages"] == 1 and state["hicache_l3_hit_tokens"] == 8
    assert state["hicache_prefetch_pages_by_rank"] == [stored_pages, 1]
    assert state["prefill_tokens_computed"] == len(prompts[0]) - 8
    assert state["hicache_prefetch_wait_seconds"] > 0
    assert_pools_free(sched)
    tree.close()
    assert host_consistent(sched)
