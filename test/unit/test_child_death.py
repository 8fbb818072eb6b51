"""The launcher names the child that died first: a rank killed by a signal (or by its watchdog)
comes before the ranks that then failed their next collective with an error, whatever the order
in which the launcher finds them dead."""

from __future__ import annotations

from types import SimpleNamespace

from sglang.srt.entrypoints.launch import death_message
from sglang.srt.managers.scheduler.scheduler_watchdog import WATCHDOG_EXIT_CODE


def _proc(pid: int, code: int) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, exitcode=code)


def test_killed_rank_is_named_before_the_ranks_that_failed_after_it():
    dead = [("Scheduler rank 0", _proc(10, 1)), ("Scheduler rank 1", _proc(11, -9))]
    msg = death_message(dead)
    assert msg.startswith(
        "Scheduler rank 1 process (pid 11) exited unexpectedly with code -9 (killed by SIGKILL)"
    )
    assert msg.endswith("also exited: Scheduler rank 0 (code 1)")


def test_watchdog_exit_is_named_first_and_explained():
    dead = [("Scheduler rank 0", _proc(10, 1)), ("Scheduler rank 1", _proc(11, WATCHDOG_EXIT_CODE))]
    assert death_message(dead).startswith(
        f"Scheduler rank 1 process (pid 11) exited unexpectedly with code "
        f"{WATCHDOG_EXIT_CODE} (watchdog timeout"
    )


def test_one_dead_child_keeps_the_plain_message():
    assert (
        death_message([("Detokenizer", _proc(12, 1))])
        == "Detokenizer process (pid 12) exited unexpectedly with code 1"
    )
