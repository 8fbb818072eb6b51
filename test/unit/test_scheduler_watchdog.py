"""SchedulerWatchdog: fires (with the loop thread's stack in the log) when a step outlives the
timeout, never while steps keep finishing or when idle; heartbeats carry the state snapshot and
the running step; a scheduler in process holds one and reports its steps to it."""

from __future__ import annotations

import logging
import threading
import time

from sglang.srt.managers.scheduler.scheduler_watchdog import SchedulerWatchdog
from sglang.test.scheduler_harness import SchedulerHarness
from sglang.test.tiny_models import TINY_LLAMA_DIR


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _stuck_in_forward(release: threading.Event) -> None:
    release.wait(10.0)  # the frame the watchdog's log must show


def test_fires_with_the_stack_of_the_stuck_step(caplog):
    fired = threading.Event()
    wd = SchedulerWatchdog(timeout_s=0.4, rank=3)
    release = threading.Event()

    def loop() -> None:
        wd.start(on_timeout=fired.set)  # started from the loop thread, as the process does
        wd.step_started()
        _stuck_in_forward(release)

    caplog.set_level(logging.ERROR)
    start = time.monotonic()
    t = threading.Thread(target=loop)
    t.start()
    try:
        assert fired.wait(5.0), "the watchdog did not fire"
        elapsed = time.monotonic() - start
        assert 0.4 <= elapsed < 2.0, elapsed
        text = caplog.text
        assert "watchdog timeout" in text and "--watchdog-timeout 0.4" in text
        assert "_stuck_in_forward" in text, "the log must show where the scheduler thread hangs"
    finally:
        release.set()
        t.join()
        wd.stop()


def test_steps_that_keep_finishing_and_idle_time_never_fire():
    fired = threading.Event()
    wd = SchedulerWatchdog(timeout_s=0.3)
    wd.start(on_timeout=fired.set)
    try:
        for _ in range(10):  # 1 s of 0.1 s steps: each one well under the timeout
            wd.step_started()
            time.sleep(0.1)
            wd.step_finished()
        assert wd.busy_since is None and wd.steps_finished == 10
        time.sleep(0.8)  # idle for longer than the timeout
        assert not fired.is_set()
        # pipelined: several steps in flight, the timeout restarts at each result
        wd.step_started()
        wd.step_started()
        time.sleep(0.2)
        wd.step_finished()
        time.sleep(0.2)
        assert not fired.is_set() and wd.steps_in_flight == 1
        assert fired.wait(2.0), "the second step never finished: must fire"
    finally:
        wd.stop()


def test_heartbeats_carry_the_snapshot_and_the_running_step():
    beats = []
    wd = SchedulerWatchdog(timeout_s=60.0, rank=0)
    wd.publish(lambda: {"num_running_reqs": 0}, busy=False)
    wd.start(heartbeat_sink=lambda: beats.append)
    try:
        assert _wait(lambda: len(beats) >= 1, 3.0)
        assert beats[-1].state == {"num_running_reqs": 0} and beats[-1].busy_since is None
        wd.step_started()
        wd.publish(lambda: {"num_running_reqs": 1}, busy=True)
        n = len(beats)
        assert _wait(lambda: len(beats) > n, 3.0)
        beat = beats[-1]
        assert beat.state == {"num_running_reqs": 1} and beat.steps_in_flight == 1
        assert beat.busy_since is not None and beat.watchdog_timeout == 60.0
    finally:
        wd.stop()


def test_publish_is_rate_limited_but_exact_when_turning_idle():
    wd = SchedulerWatchdog(timeout_s=60.0)
    calls = []

    def state() -> dict:
        calls.append(1)
        return {"n": len(calls)}

    wd.publish(state, busy=True)
    for _ in range(100):
        wd.publish(state, busy=True)
    assert len(calls) == 1  # not once per step
    wd.publish(state, busy=False)
    assert len(calls) == 2 and wd.snapshot == {"n": 2}


def test_scheduler_reports_its_steps_and_request_table():
    h = SchedulerHarness(model_path=TINY_LLAMA_DIR, load_format="dummy", max_total_tokens=512)
    sched = h.scheduler
    initial = sched.internal_state()
    assert initial["free_req_slots"] == initial["max_req_slots"] > 0
    h.submit([5, 6, 7, 8], max_new_tokens=4)
    h.run()
    wd = sched.watchdog
    assert wd.steps_finished == sched.forward_ct >= 4 and wd.steps_in_flight == 0 and wd.busy_since is None
    assert wd.snapshot["free_req_slots"] == initial["free_req_slots"]
    assert wd.snapshot["num_running_reqs"] == 0
