"""`make demo`: start a server, send one chat request and one streaming /generate, then stop.

Usage: python -m sglang.demo [launch_server flags...]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import requests

from sglang.srt.utils.network import get_free_port


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError("server did not become healthy")


def main(argv: list[str]) -> int:
    port = get_free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(port), *argv]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        _wait_healthy(url, proc)
        chat = requests.post(
            url + "/v1/chat/completions",
            json={
                "model": "default",
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 48,
                "temperature": 0,
            },
            timeout=300,
        ).json()
        print("\n== chat ==\n" + chat["choices"][0]["message"]["content"], flush=True)
        print("\n== streaming /generate ==", flush=True)
        shown = ""
        with requests.post(
            url + "/generate",
            json={
                "text": "The capital of France is",
                "sampling_params": {"max_new_tokens": 32, "temperature": 0},
                "stream": True,
            },
            stream=True,
            timeout=300,
        ) as resp:
            for line in resp.iter_lines():
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                text = json.loads(line[5:])["text"]
                print(text[len(shown) :], end="", flush=True)
                shown = text
        print("\n\ndemo finished", flush=True)
        return 0
    finally:
        proc.send_signal(signal.SIGTERM)  # the server stops its own children
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
