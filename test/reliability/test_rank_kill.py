"""A rank killed under load (tp 2, pp 2: each rank of the pipeline in turn): the server exits
within 30 s with a log naming the rank, its clients get an answer or a closed connection (none
hangs), and no process of the server is left behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from server_helpers import child_pids, launch_server, pid_alive, wait_until

pytestmark = pytest.mark.slow  # starts its own servers

CASES = [
    ("tp2", ("--tp-size", "2"), 1),
    ("pp2", ("--pp-size", "2"), 1),  # the last stage
    ("pp2", ("--pp-size", "2"), 0),  # stage 0: the rank that schedules and talks to the tokenizer
]


def _ranks(server_pid: int) -> dict[int, int]:
    """World rank -> pid of the server's scheduler processes (named sglang-rank<N>)."""
    out = {}
    for pid in child_pids(server_pid):
        try:
            name = open(f"/proc/{pid}/comm").read().strip()
        except OSError:
            continue
        if name.startswith("sglang-rank"):
            out[int(name[len("sglang-rank") :])] = pid
    return out


@pytest.mark.parametrize("name, args, victim", CASES, ids=[f"{c[0]}-rank{c[2]}" for c in CASES])
def test_killed_rank_ends_the_server(name, args, victim):
    handle = launch_server((*args, "--num-threads", "1"))
    try:
        ranks = _ranks(handle.proc.pid)
        assert sorted(ranks) == [0, 1], ranks
        everyone = [handle.proc.pid, *child_pids(handle.proc.pid)]
        outcomes: list[str] = []

        def client(i: int) -> None:  # long streams in flight when the rank dies
            body = {
                "input_ids": [5, 6, 7, i],
                "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
                "stream": True,
            }
            try:
                with httpx.stream("POST", handle.url + "/generate", json=body, timeout=120) as r:
                    last = ""
                    for line in r.iter_lines():
                        last = line if line.startswith("data:") and "[DONE]" not in line else last
                outcomes.append(
                    "error event" if '"error"' in last and f"Scheduler rank {victim}" in last else "ended"
                )
            except httpx.HTTPError as err:
                outcomes.append(type(err).__name__)

        clients = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(8)]
        for t in clients:
            t.start()
        time.sleep(1.5)  # the streams are running
        start = time.monotonic()
        os.kill(ranks[victim], signal.SIGKILL)
        assert wait_until(lambda: handle.proc.poll() is not None, 30.0, 0.02), (
            "server still running 30 s after a rank died"
        )
        exited_after = time.monotonic() - start
        assert exited_after < 30.0
        assert handle.proc.returncode != 0
        assert wait_until(lambda: not any(pid_alive(p) for p in everyone), 10.0), [
            p for p in everyone if pid_alive(p)
        ]
        for t in clients:
            t.join(30.0)
        assert len(outcomes) == len(clients), "a client still hangs after the server exited"
        assert set(outcomes) == {"error event"}, outcomes  # each stream was told why it ended
        log = Path(handle.log_path).read_text(errors="replace")
        assert f"Scheduler rank {victim} process (pid {ranks[victim]}) exited unexpectedly" in log, log
        assert "killed by SIGKILL" in log
        assert f"a child process died (Scheduler rank {victim})" in log
        print(
            f"\nreliability[kill {name} rank {victim}]: server exited {exited_after:.2f} s after the kill, "
            f"{len(everyone)} processes gone, clients: {sorted(set(outcomes))}"
        )
    finally:
        handle.stop()
