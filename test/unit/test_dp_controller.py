"""The data-parallel controller's pure parts (managers/dp/dp_controller.py) and the DP-attention flags:
load balancing from replica reports plus requests still in transit, matching the replicas'
control replies to their requests, merging them, and the refusals that name the flags."""

from __future__ import annotations

import pytest

from sglang.srt.managers.dp.dp_controller import (
    DPBalancer,
    ReplyCollector,
    merge_heartbeats,
    merge_replies,
    merge_states,
)
from sglang.srt.managers.io_struct import (
    DPLoadReport,
    FlushCacheReqOutput,
    GetInternalStateReqOutput,
    SchedulerHeartbeat,
)
from sglang.srt.metrics.collector import ServerMetrics
from sglang.srt.server_args import ServerArgs
from sglang.test.tiny_models import TINY_LLAMA_DIR


def test_round_robin_and_auto():
    for method in ("round_robin", "auto"):
        b = DPBalancer(3, method)
        assert [b.pick(10) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_follow_bootstrap_room_and_auto_on_pd_servers():
    """PD (upstream's follow_bootstrap_room): replica = room % dp_size, so both sides of the
    transfer know the replica from the room; `auto` picks it on a PD server only."""
    for b in (DPBalancer(3, "follow_bootstrap_room"), DPBalancer(3, "auto", pd=True)):
        assert [b.pick(10, room) for room in (7, 8, 9, 2**62 + 1, 3)] == [1, 2, 0, (2**62 + 1) % 3, 0]
        assert [b.pick(10) for _ in range(4)] == [0, 1, 2, 0]  # no room (not a PD request): in turn
    b = DPBalancer(2, "auto")
    assert [b.pick(1, room) for room in (1, 1)] == [0, 1]  # a normal server: round robin


def test_total_requests_counts_requests_in_transit():
    b = DPBalancer(2, "total_requests")
    assert b.pick(5) == 0  # tie: lowest rank
    assert b.pick(5) == 1
    assert b.pick(5) == 0
    # replica 0 reports it took both of its requests and one already finished
    b.on_report(DPLoadReport(dp_rank=0, num_reqs=1, num_tokens=9, received=2))
    assert (b.num_reqs(0), b.num_reqs(1)) == (1, 1)  # replica 1's request is still in transit
    b.on_report(DPLoadReport(dp_rank=1, num_reqs=1, num_tokens=5, received=1))
    assert b.pick(5) == 0  # tie again
    b.on_report(DPLoadReport(dp_rank=1, num_reqs=0, num_tokens=0, received=1))
    assert b.pick(5) == 1  # replica 1 is empty now
    # a stale report (fewer requests received than before) does not resurrect requests
    b.on_report(DPLoadReport(dp_rank=1, num_reqs=0, num_tokens=0, received=0))
    assert b.num_reqs(1) == 1


def test_total_tokens_weighs_prompt_lengths():
    b = DPBalancer(2, "total_tokens")
    assert b.pick(1000) == 0
    assert b.pick(10) == 1
    assert b.pick(10) == 1  # 1000 in transit to replica 0 vs 10 to replica 1
    b.on_report(DPLoadReport(dp_rank=0, num_reqs=0, num_tokens=0, received=1))  # replica 0 finished it
    assert b.num_tokens(0) == 0 and b.num_tokens(1) == 20
    assert b.pick(10) == 0


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="load-balance-method"):
        DPBalancer(2, "shortest_queue")


def test_replies_are_matched_per_replica_in_order():
    c = ReplyCollector(2)
    a0, a1 = (
        GetInternalStateReqOutput({"dp_rank": 0, "k": 1}),
        GetInternalStateReqOutput({"dp_rank": 0, "k": 2}),
    )
    assert c.add(0, a0) == [] and c.add(0, a1) == []  # replica 0 answered two requests first
    b0 = GetInternalStateReqOutput({"dp_rank": 1, "k": 1})
    assert c.add(1, b0) == [[a0, b0]]
    assert c.add(1, FlushCacheReqOutput(True)) == []  # another kind is matched separately
    b1 = GetInternalStateReqOutput({"dp_rank": 1, "k": 2})
    assert c.add(1, b1) == [[a1, b1]]


def test_merging():
    states = [
        {
            "dp_rank": 0,
            "max_total_num_tokens": 100,
            "available_kv_tokens": 90,
            "num_running_reqs": 1,
            "cp_size": 1,
        },
        {
            "dp_rank": 1,
            "max_total_num_tokens": 100,
            "available_kv_tokens": 100,
            "num_running_reqs": 0,
            "cp_size": 1,
        },
    ]
    merged = merge_states(states)
    assert merged["max_total_num_tokens"] == 200 and merged["available_kv_tokens"] == 190
    assert merged["num_running_reqs"] == 1 and merged["cp_size"] == 1 and merged["dp_size"] == 2
    assert "dp_rank" not in merged
    out = merge_replies([GetInternalStateReqOutput(s) for s in states])
    assert out.replica_states == states and out.state == merged
    ok = merge_replies([FlushCacheReqOutput(True), FlushCacheReqOutput(True)])
    assert ok.success
    bad = merge_replies([FlushCacheReqOutput(True), FlushCacheReqOutput(False, "requests are running")])
    assert not bad.success and "replica 1: requests are running" in bad.message


def test_heartbeats_merge_to_the_busiest_replica():
    def beat(d, busy, steps, t):
        return SchedulerHeartbeat(
            rank=d,
            dp_rank=d,
            sent_time=t + 1,
            steps_finished=steps,
            steps_in_flight=int(busy is not None),
            busy_since=busy,
            state={"dp_rank": d, "num_running_reqs": d + 1},
            state_time=t,
            watchdog_timeout=300.0,
        )

    merged = merge_heartbeats([beat(0, None, 10, 100.0), beat(1, 95.0, 4, 99.0)])
    assert merged.busy_since == 95.0  # replica 1 is inside a step: the server is busy
    assert merged.steps_finished == 14 and merged.steps_in_flight == 1 and merged.state_time == 99.0
    assert merged.state["num_running_reqs"] == 3 and [s["dp_rank"] for s in merged.replica_states] == [0, 1]
    assert merge_heartbeats([beat(0, None, 1, 1.0), beat(1, None, 1, 1.0)]).busy_since is None


def test_metrics_have_a_series_per_replica():
    m = ServerMetrics("m", dp_size=2)
    m.update_scheduler_state(
        {},
        [
            {"num_running_reqs": 3, "max_total_num_tokens": 100, "available_kv_tokens": 75},
            {"num_running_reqs": 1, "max_total_num_tokens": 100, "available_kv_tokens": 100},
        ],
    )
    text = m.render().decode()
    assert 'sglang:num_running_reqs{dp_rank="0",model_name="m"} 3.0' in text
    assert 'sglang:num_running_reqs{dp_rank="1",model_name="m"} 1.0' in text
    assert 'sglang:token_usage{dp_rank="0",model_name="m"} 0.25' in text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tp_size=2, dp_size=2), "--dp-size > 1 needs --enable-dp-attention"),
        (dict(tp_size=3, dp_size=2, enable_dp_attention=True), r"tp_size \(3\) must be divisible by dp_size"),
        (
            dict(tp_size=2, dp_size=2, enable_dp_attention=True, moe_dense_tp_size=2),
            "--moe-dense-tp-size must be 1",
        ),
        (
            dict(tp_size=2, dp_size=2, enable_dp_attention=True, load_balance_method="x"),
            "--load-balance-method",
        ),
        (
            dict(tp_size=2, dp_size=2, enable_dp_attention=True, nnodes=2, dist_init_addr="127.0.0.1:5000"),
            "--dp-size > 1 with --nnodes > 1",
        ),
        (dict(tp_size=2, ep_size=1, moe_a2a_backend="all_to_all"), r"ep_size == tp_size"),
        (dict(tp_size=2, ep_size=2, moe_a2a_backend="deepep"), "--moe-a2a-backend must be one of"),
    ],
)
def test_flag_refusals(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServerArgs(model_path=TINY_LLAMA_DIR, **kwargs).validate()


def test_accepted_flags():
    ServerArgs(
        model_path=TINY_LLAMA_DIR,
        tp_size=2,
        dp_size=2,
        enable_dp_attention=True,
        moe_dense_tp_size=1,
        enable_dp_lm_head=True,
        load_balance_method="total_tokens",
    ).validate()
    ServerArgs(model_path=TINY_LLAMA_DIR, tp_size=2, ep_size=2, moe_a2a_backend="all_to_all").validate()
    ServerArgs(model_path=TINY_LLAMA_DIR, enable_dp_attention=True).validate()  # dp 1: one replica
