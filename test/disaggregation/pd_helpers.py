"""Helpers of the PD tests: start prefill / decode / colocated servers and `sglang-router` as
subprocesses (each in its own session, so a test can kill a server's whole process group), read
their KV counts, send a request the way the router does (to both servers, same room)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import httpx
import pytest

from sglang.srt.distributed.init import get_free_port as free_port
from sglang.test.polling import wait_until

REPO = Path(__file__).resolve().parents[2]
TINY_LLAMA = str(REPO / "python" / "sglang" / "test" / "assets" / "tiny-llama")
TINY_DSV32 = str(REPO / "python" / "sglang" / "test" / "assets" / "tiny-deepseek-v32")
STARTUP_TIMEOUT_S = 300.0
# A fast heartbeat so that failure tests notice a dead peer in seconds (upstream: 5 s); a 20 s
# bootstrap timeout (upstream 300 s), which the router tests' error-within-45-s bounds rely on;
# a 60 s waiting timeout, long enough for a 4-rank prefill's transfer on a loaded 2-core CI box
# (20 s once timed a parity test out there); the tests of that timeout set their own few seconds.
PD_ENV = {
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "1",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "20",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "60",
}


@dataclass
class Proc:
    proc: subprocess.Popen
    url: str
    log_path: str
    bootstrap_port: Optional[int] = None
    extra: dict = field(default_factory=dict)

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")[-6000:]

    def kill(self) -> None:
        """SIGKILL the server and its children (its own process group)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def state(self) -> dict:
        return self.states()[0]

    def states(self) -> list[dict]:
        """One internal state per attention-DP replica (one in all without DP)."""
        r = httpx.get(self.url + "/get_server_info", timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["internal_states"]


def dummy_args(model: str, max_total_tokens: int) -> list[str]:
    """Server flags of a tiny model with dummy float32 weights, one thread per rank."""
    return [
        *("--model-path", model, "--load-format", "dummy", "--dtype", "float32"),
        *("--num-threads", "1", "--max-total-tokens", str(max_total_tokens)),
    ]


def post_async(url: str, body: dict, out: dict, key: str) -> threading.Thread:
    """POST /generate on a thread; `out[key]` = (status or None, json or the error, seconds)."""

    def run() -> None:
        t0 = time.monotonic()
        try:
            r = httpx.post(url + "/generate", json=body, timeout=120)
            out[key] = (r.status_code, r.json(), time.monotonic() - t0)
        except httpx.HTTPError as err:
            out[key] = (None, repr(err), time.monotonic() - t0)

    t = threading.Thread(target=run)
    t.start()
    return t


def _spawn(cmd: list[str], name: str, env: Optional[dict] = None) -> tuple[subprocess.Popen, str]:
    log = tempfile.NamedTemporaryFile(prefix=f"sglang-pd-{name}-", suffix=".log", delete=False)
    full_env = {**os.environ, **PD_ENV, **(env or {})}
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), env=full_env, start_new_session=True
    )
    return proc, log.name


def launch(
    args: list[str], name: str, mode: str = "null", env: Optional[dict] = None, attempts: int = 3
) -> Proc:
    """A server (`--disaggregation-mode mode`), warm (/health_generate answered). The machine is
    shared: a port picked free may be taken before the server binds it, so a start whose port was
    stolen is retried on new ports."""
    for attempt in range(attempts):
        handle = _launch_once(args, name, mode, env, last=attempt == attempts - 1)
        if handle is not None:
            return handle
    raise AssertionError("unreachable")


def _launch_once(args: list[str], name: str, mode: str, env: Optional[dict], last: bool) -> Optional[Proc]:
    port = free_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(port), "--log-level", "info", *args]
    bootstrap = None
    if mode != "null":
        cmd += ["--disaggregation-mode", mode]
        if mode == "prefill":
            bootstrap = free_port()
            cmd += ["--disaggregation-bootstrap-port", str(bootstrap)]
    proc, log = _spawn(cmd, name, env)
    handle = Proc(proc, f"http://127.0.0.1:{port}", log, bootstrap)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if not last and "address already in use" in handle.log():
                return None
            pytest.fail(f"{name} server exited with {proc.returncode}; log {log}:\n{handle.log()}")
        try:  # /health_generate runs a forward (a PD server serves it alone): the server is warm
            if httpx.get(handle.url + "/health_generate", timeout=60.0).status_code == 200:
                info = httpx.get(handle.url + "/get_server_info", timeout=30).json()
                if (
                    proc.poll() is None
                    and info.get("disaggregation_mode") == mode
                    and info.get("port") == port
                ):
                    return handle
                if not last:  # another process answers on this port
                    handle.kill()
                    return None
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    handle.kill()
    pytest.fail(f"{name} server not healthy in {STARTUP_TIMEOUT_S}s; log {log}:\n{handle.log()}")


class ServerPool:
    """Servers shared by a module's tests: each started on its first use and stopped after its last
    planned one (`uses`: key -> number of tests that take it; a key run fewer times, e.g. under
    `-k`, is stopped by `close`). A decode server serves any prefill server (the room names the
    prefill's bootstrap address), so a layout matrix starts each distinct server once. `get`
    flushes the server's radix cache, so a test's prompts take the path they take on a fresh one."""

    def __init__(self, uses: dict) -> None:
        self.left = dict(uses)
        self.live: dict = {}

    def get(self, key, args: list[str], name: str, mode: str, env: Optional[dict] = None) -> Proc:
        server = self.live.get(key)
        if server is None:
            server = self.live[key] = launch(args, name, mode=mode, env=env)
        r = httpx.post(server.url + "/flush_cache", timeout=30)
        assert r.status_code == 200, r.text
        return server

    def release(self, key, broken: bool = False) -> None:
        """`broken`: the test using it failed, so the next user gets a fresh server."""
        self.left[key] -= 1
        if (broken or self.left[key] <= 0) and key in self.live:
            self.live.pop(key).stop()

    def close(self) -> None:
        for server in self.live.values():
            server.stop()
        self.live.clear()


def launch_router(prefill: Proc, decode: Proc, extra: Optional[list[str]] = None) -> Proc:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "sglang_router.launch_router",
        "--pd-disaggregation",
        "--prefill",
        prefill.url,
        str(prefill.bootstrap_port),
        "--decode",
        decode.url,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        # its own metrics port: the default (29000) is taken when two routers run at once (xdist)
        "--prometheus-port",
        str(free_port()),
        "--log-level",
        "warn",
        *(extra or []),
    ]
    proc, log = _spawn(cmd, "router")
    handle = Proc(proc, f"http://127.0.0.1:{port}", log)

    def ready() -> bool:  # the router registers workers in the background: wait for a real answer
        if proc.poll() is not None:
            pytest.fail(f"router exited with {proc.returncode}; log {log}:\n{handle.log()}")
        try:
            r = httpx.post(
                handle.url + "/generate",
                timeout=60,
                json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1}},
            )
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    if not wait_until(ready, 180, 1.0):
        handle.kill()
        pytest.fail(f"router never served a request; log {log}:\n{handle.log()}")
    return handle


@contextlib.contextmanager
def router_stack(common: list[str], chunk: int, decode_args: tuple = (), prefix: str = ""):
    """A colocated reference server, a prefill server (chunked prefill), a decode server
    (`decode_args` added) and sglang-router in front of the pair; all stopped afterwards."""
    started = []
    try:
        ref = launch(common, f"{prefix}colocated")
        started.append(ref)
        prefill = launch([*common, "--chunked-prefill-size", str(chunk)], f"{prefix}prefill", mode="prefill")
        started.append(prefill)
        decode = launch([*common, *decode_args], f"{prefix}decode", mode="decode")
        started.append(decode)
        router = launch_router(prefill, decode)
        started.append(router)
        yield {"ref": ref, "prefill": prefill, "decode": decode, "router": router}
    finally:
        for p in reversed(started):
            p.stop()


def kv_counts(server: Proc) -> tuple[int, int]:
    """(free + evictable KV tokens, pool size) once the server is idle (nothing queued anywhere)."""
    s = server.state()
    return s["available_kv_tokens"], s["max_total_num_tokens"]


def _idle(state: dict) -> bool:
    queued = sum(v for k, v in state.items() if k.startswith("pd_") and k.endswith(("queue", "draining")))
    return (
        state["available_kv_tokens"] == state["max_total_num_tokens"]
        and queued == 0
        and state["num_running_reqs"] == 0
        and state["num_waiting_reqs"] == 0
    )


def wait_kv_restored(server: Proc, timeout: float) -> dict:
    """Wait until every KV slot of every attention-DP replica is free or evictable again and nothing
    is queued; returns the (first replica's) state."""
    states: list[dict] = []

    def restored() -> bool:
        nonlocal states
        states = server.states()
        return all(_idle(s) for s in states)

    assert wait_until(restored, timeout), f"KV not restored within {timeout}s: {states}"
    return states[0]


def post_pair(
    prefill: Proc, decode: Proc, body: dict, timeout: float = 120, room: Optional[int] = None
) -> tuple[dict, dict]:
    """What the router does: the same request, with one room (random unless given), to both
    servers at once."""
    body = {
        **body,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": random.getrandbits(63) if room is None else room,
    }
    out: dict = {}

    def post(name: str, server: Proc) -> None:
        r = httpx.post(server.url + "/generate", json=body, timeout=timeout)
        out[name] = (
            r.json() if r.headers.get("content-type", "").startswith("application/json") else {"raw": r.text}
        )

    threads = [
        threading.Thread(target=post, args=(n, s)) for n, s in (("prefill", prefill), ("decode", decode))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out["prefill"], out["decode"]
