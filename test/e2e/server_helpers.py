"""Helpers of the end-to-end tests: launch `python -m sglang.launch_server` (tiny Llama, dummy
float32 weights, free port) as a subprocess, read /proc, poll the scheduler state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import httpx
import pytest

from sglang.srt.distributed.init import get_free_port as free_port
from sglang.test.polling import wait_until
from sglang.test.procs import PPID, live_pids

REPO = Path(__file__).resolve().parents[2]
TINY_LLAMA = str(REPO / "python" / "sglang" / "test" / "assets" / "tiny-llama")
API_KEY = "sk-e2e-test"
STARTUP_TIMEOUT_S = 180.0


def child_pids(pid: int) -> list[int]:
    """Every live descendant of `pid`, read from /proc: on CPU the ranks and the detokenizer are
    children of the server's fork server (platforms/launch_defaults.py), so grandchildren."""
    out, todo = [], [pid]
    while todo:
        kids = live_pids(PPID, todo.pop())
        out += kids
        todo += kids
    return out


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rfind(")") + 2 :].split()[0] not in ("Z", "X")


@dataclass
class ServerHandle:
    proc: subprocess.Popen
    url: str
    log_path: str
    api_key: Optional[str]

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers=self.headers, timeout=kwargs.pop("timeout", 60.0), **kwargs
        )

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


PORT_TAKEN = "address already in use"
PORT_ATTEMPTS = 3


def launch_server(
    extra_args: tuple[str, ...] = (),
    api_key: Optional[str] = None,
    entry: tuple[str, ...] = ("-m", "sglang.launch_server"),
    model: str = TINY_LLAMA,
    env: Optional[dict] = None,
) -> ServerHandle:
    """Start a server subprocess and wait for /health (fails the test with its log otherwise).
    `entry`: what python runs (a script that wraps `launch_server`, for fault injection);
    `env`: extra environment variables. A free port can be taken before the server binds it (by
    another test's gloo connection, which binds ephemeral ports): then it starts again on another."""
    for attempt in range(PORT_ATTEMPTS):
        handle = _start_server(extra_args, api_key, entry, model, env)
        if handle.proc.poll() is None or PORT_TAKEN not in handle.log() or attempt == PORT_ATTEMPTS - 1:
            break
    if handle.proc.poll() is not None:
        pytest.fail(
            f"server exited with {handle.proc.returncode} during start-up; log {handle.log_path}:\n{handle.log()}"
        )
    return handle


def _start_server(extra_args, api_key, entry, model, env) -> ServerHandle:
    """One start: the handle once /health answers, or of a server that exited during start-up."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="sglang-e2e-", suffix=".log", delete=False)
    cmd = [
        sys.executable,
        *entry,
        "--model-path",
        model,
        "--load-format",
        "dummy",
        "--dtype",
        "float32",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *extra_args,
    ]
    if api_key:
        cmd += ["--api-key", api_key]
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), env=full_env)
    handle = ServerHandle(proc, f"http://127.0.0.1:{port}", log.name, api_key)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return handle
        try:
            if httpx.get(f"{handle.url}/health", timeout=1.0).status_code == 200:
                return handle
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    handle.stop()
    pytest.fail(f"server did not become healthy in {STARTUP_TIMEOUT_S}s; log {log.name}:\n{handle.log()}")


def internal_state(client: httpx.Client) -> dict:
    r = client.get("/get_server_info")
    assert r.status_code == 200, r.text
    return r.json()["internal_states"][0]


def wait_idle(client: httpx.Client, timeout: float = 20.0) -> dict:
    """Wait until the scheduler has no running or waiting request; returns its state."""
    state: dict = {}

    def idle() -> bool:
        nonlocal state
        state = internal_state(client)
        return state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0

    assert wait_until(idle, timeout, 0.2), f"scheduler not idle: {state}"
    return state


def leaks_after_load(client: httpx.Client, initial: dict, timeout: float = 60.0) -> dict:
    """What a server still holds once idle after a load, against `initial` (its `internal_state`
    before the load); every value 0 when nothing leaked. Flushes the prefix cache."""
    state = wait_idle(client, timeout=timeout)
    info = client.get("/get_server_info").json()
    leaks = {
        "unfinished in the tokenizer manager": info["num_unfinished_requests"],
        "KV tokens not available": initial["available_kv_tokens"] - state["available_kv_tokens"],
        "request rows not free": initial["free_req_slots"] - state["free_req_slots"],
        "grammar matchers": state.get("grammar_matchers", 0),
        "grammar queue": state.get("grammar_queue", 0),
    }
    assert client.post("/flush_cache").status_code == 200
    flushed = internal_state(client)
    leaks["KV tokens not free after a flush"] = initial["free_kv_tokens"] - flushed["free_kv_tokens"]
    leaks["evictable KV after a flush"] = flushed["evictable_kv_tokens"]
    return leaks


def flush(client: httpx.Client) -> None:
    wait_idle(client)
    r = client.post("/flush_cache")
    assert r.status_code == 200, r.text


def openai_answers(handle: ServerHandle) -> dict:
    """A server's greedy answers to a fixed set of openai-client requests: a chat, a completion, the
    same completion streamed, and a completion of token ids (`ignore_eos`, so each answer has its
    full length). Two servers of the same model must give equal dicts (parallel vs single rank)."""
    import openai

    client = openai.OpenAI(
        base_url=handle.url + "/v1", api_key=handle.api_key or "none", max_retries=0, timeout=120
    )
    common = dict(model="default", temperature=0, extra_body={"ignore_eos": True})
    chat = client.chat.completions.create(
        messages=[{"role": "user", "content": "hi there"}], max_tokens=8, **common
    )
    whole = client.completions.create(prompt="hello", max_tokens=6, **common)
    pieces = list(client.completions.create(prompt="hello", max_tokens=6, stream=True, **common))
    ids = client.completions.create(prompt=list(range(5, 5 + 37)), max_tokens=6, **common)
    return {
        "chat": chat.choices[0].message.content,
        "chat_usage": (chat.usage.prompt_tokens, chat.usage.completion_tokens),
        "chat_finish": chat.choices[0].finish_reason,
        "completion": whole.choices[0].text,
        "completion_usage": (whole.usage.prompt_tokens, whole.usage.completion_tokens),
        "stream": "".join(p.choices[0].text for p in pieces),
        "stream_chunks": len(pieces) >= 2,
        "stream_finish": pieces[-1].choices[0].finish_reason,
        "ids_completion": ids.choices[0].text,
        "ids_usage": (ids.usage.prompt_tokens, ids.usage.completion_tokens),
    }


def assert_full_answers(answers: dict) -> None:
    """The answers ran to their length: 8 / 6 / 6 tokens, streamed in several chunks that add up to
    the non-streamed text."""
    assert answers["chat_usage"][1] == 8 and answers["chat_finish"] == "length"
    assert answers["completion_usage"][1] == 6 and answers["ids_usage"] == (37, 6)
    assert answers["stream_chunks"] and answers["stream_finish"] == "length"
    assert answers["stream"] == answers["completion"]
