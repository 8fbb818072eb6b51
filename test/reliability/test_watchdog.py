"""`--watchdog-timeout`: a forward that hangs ends the server after that many seconds, with a log
that names the rank, says it was the watchdog and shows where the scheduler thread hung; no
process is left behind. Requests before the hang are served normally."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from fault_server import HANG_TOKEN
from server_helpers import child_pids, launch_server, pid_alive, wait_until

pytestmark = pytest.mark.slow  # starts its own server

FAULT_SERVER = str(Path(__file__).with_name("fault_server.py"))
TIMEOUT_S = 4.0


def test_hanging_forward_ends_the_server_after_the_watchdog_timeout():
    handle = launch_server(("--watchdog-timeout", str(TIMEOUT_S)), entry=(FAULT_SERVER,))
    try:
        r = httpx.post(
            handle.url + "/generate",
            json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        everyone = [handle.proc.pid, *child_pids(handle.proc.pid)]

        def poisoned() -> None:
            try:
                httpx.post(handle.url + "/generate", json={"input_ids": [5, HANG_TOKEN, 7]}, timeout=120)
            except httpx.HTTPError:
                pass  # the server goes away under it

        threading.Thread(target=poisoned, daemon=True).start()
        start = time.monotonic()
        assert wait_until(lambda: handle.proc.poll() is not None, TIMEOUT_S + 30), "server still running"
        elapsed = time.monotonic() - start
        assert elapsed >= TIMEOUT_S - 0.5, f"exited after {elapsed:.1f} s, before the watchdog timeout"
        assert handle.proc.returncode != 0
        assert wait_until(lambda: not any(pid_alive(p) for p in everyone), 10.0), "processes left behind"
        log = Path(handle.log_path).read_text(errors="replace")
        assert "Scheduler rank 0] ERROR watchdog timeout: a forward step has not finished" in log, log[-3000:]
        assert f"--watchdog-timeout {TIMEOUT_S:g}" in log
        assert "hanging_forward" in log, "the log must show where the forward hung"
        assert "exited unexpectedly with code 86 (watchdog timeout" in log
    finally:
        handle.stop()
