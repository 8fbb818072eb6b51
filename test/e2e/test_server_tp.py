"""Servers with tensor parallelism: `--tp-size 2` answers the openai client exactly as the
single-rank server does; the same TP2 world
launched as two "nodes" on loopback answers identically; killing one rank ends the whole server
(every node) cleanly, with the failing rank's error in the log (the last test kills a rank of the
module's tp 2 server, which no test uses after it, instead of starting one more)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from server_helpers import (
    REPO,
    TINY_LLAMA,
    assert_full_answers,
    child_pids,
    free_port,
    launch_server,
    openai_answers,
    pid_alive,
    wait_until,
)

pytestmark = pytest.mark.slow  # starts its own servers / engines

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [40, 41, 42]]


def _generate(url: str) -> list[list[int]]:
    r = httpx.post(url + "/generate", json={"input_ids": PROMPTS, "sampling_params": GREEDY}, timeout=60)
    assert r.status_code == 200, r.text
    return [item["output_ids"] for item in r.json()]


def _scheduler_pids(server_pid: int) -> list[int]:
    """Scheduler rank processes among the server's children (by their command line)."""
    out = []
    for pid in child_pids(server_pid):
        try:
            name = open(f"/proc/{pid}/comm").read().strip()
        except OSError:
            continue
        if name.startswith("sglang-rank"):
            out.append(pid)
    return out


@pytest.fixture(scope="module")
def tp2_server():
    handle = launch_server(("--tp-size", "2"))
    yield handle
    handle.stop()


def test_tp2_openai_answers_equal_single_rank(tp2_server, server):
    """Chat, completion, streamed completion and token-id prompt through the openai client: the
    tp 2 server's greedy answers equal the single-rank session server's (same model and weights)."""
    got = openai_answers(tp2_server)
    assert_full_answers(got)
    assert got == openai_answers(server)


def test_two_node_loopback_matches_single_node(tp2_server):
    expected = _generate(tp2_server.url)
    addr = f"127.0.0.1:{free_port()}"
    common = ("--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr)
    log = tempfile.NamedTemporaryFile(prefix="sglang-node1-", suffix=".log", delete=False)
    node1 = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            TINY_LLAMA,
            "--load-format",
            "dummy",
            "--dtype",
            "float32",
            "--log-level",
            "warning",
            *common,
            "--node-rank",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(REPO),
    )
    node0 = launch_server((*common, "--node-rank", "0"))
    try:
        assert _generate(node0.url) == expected
        # Kill node 1's rank: node 1 exits, then node 0's rank fails in its next collective and
        # node 0's server exits as well: nothing is left behind within 30 s.
        ranks = _scheduler_pids(node1.pid)
        assert len(ranks) == 1
        victims = [node0.proc.pid, node1.pid, *ranks, *_scheduler_pids(node0.proc.pid)]
        os.kill(ranks[0], signal.SIGKILL)
        assert wait_until(lambda: node1.poll() is not None and node0.proc.poll() is not None, 30.0)
        assert node1.returncode != 0 and node0.proc.returncode != 0
        assert wait_until(lambda: not any(pid_alive(p) for p in victims), 10.0)
    finally:
        node0.stop()
        if node1.poll() is None:
            node1.kill()


def test_killing_a_rank_ends_the_server(tp2_server):
    handle = tp2_server  # the module's last test: nothing uses this server after it
    try:
        ranks = _scheduler_pids(handle.proc.pid)
        assert len(ranks) == 2
        everyone = [handle.proc.pid, *child_pids(handle.proc.pid)]
        start = time.monotonic()
        os.kill(ranks[1], signal.SIGKILL)
        assert wait_until(lambda: handle.proc.poll() is not None, 30.0), (
            "server still running 30 s after a rank died"
        )
        assert handle.proc.returncode != 0
        assert wait_until(lambda: not any(pid_alive(p) for p in everyone), 10.0), "processes left behind"
        assert time.monotonic() - start < 30.0
        assert "Scheduler rank 1" in handle.log()
    finally:
        handle.stop()
