"""The HTTP bootstrap server (runs in the prefill server's main process) and its client, shared
by every transfer backend (base/bootstrap.py has their interfaces).

HTTP, JSON, three routes (upstream's protocol, our fields):
  PUT /route   a prefill rank registers its `PrefillRankInfo`; the first registrant fixes the
               topology (every later one must agree on the sizes);
  GET /route   the registered ranks and whether all of them are there (`complete`);
  GET /health  200 while the server lives (the decode side's heartbeat).
A plain `ThreadingHTTPServer` in a daemon thread: it serves a handful of requests per request
of the model, none of them on a hot path.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

import requests

from sglang.srt.disaggregation.base.bootstrap import BaseBootstrapClient, BaseKVBootstrapServer
from sglang.srt.disaggregation.base.messages import PrefillRankInfo, PrefillTopology

logger = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 5.0


class BootstrapServer(BaseKVBootstrapServer):
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._lock = threading.Lock()
        self._ranks: dict[tuple, PrefillRankInfo] = {}
        self._world: Optional[int] = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:  # quiet: the scheduler logs what matters
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                if self.path.startswith("/health"):
                    self._reply(200, {"status": "ok"})
                elif self.path.startswith("/route"):
                    self._reply(200, outer.snapshot())
                else:
                    self._reply(404, {"error": f"unknown path {self.path}"})

            def do_PUT(self) -> None:  # noqa: N802
                if not self.path.startswith("/route"):
                    self._reply(404, {"error": f"unknown path {self.path}"})
                    return
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                    info = PrefillRankInfo.from_json(json.loads(self.rfile.read(length)))
                    outer.register(info)
                except (ValueError, KeyError, TypeError) as err:
                    self._reply(400, {"error": str(err)})
                    return
                self._reply(200, {"status": "ok"})

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="pd-bootstrap", daemon=True)

    def start(self) -> "BootstrapServer":
        self.thread.start()
        logger.info("PD bootstrap server on http://%s:%d", self.host, self.port)
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def register(self, info: PrefillRankInfo) -> None:
        with self._lock:
            if self._ranks:
                first = next(iter(self._ranks.values()))
                sizes = lambda r: (r.tp_size, r.cp_size, r.pp_size, r.dp_size, r.page_size, r.kv_dtype)  # noqa: E731
                if sizes(info) != sizes(first):
                    raise ValueError(f"rank {info.key} disagrees with the registered topology {sizes(first)}")
            self._ranks[info.key] = info
            self._world = info.world_size

    def snapshot(self) -> dict:
        with self._lock:
            ranks = [r.to_json() for _, r in sorted(self._ranks.items())]
            complete = self._world is not None and len(ranks) == self._world
        return {"ranks": ranks, "complete": complete}


# ---------------------------------------------------------------------------- clients
def register_rank(bootstrap_url: str, info: PrefillRankInfo, timeout_s: float = 60.0) -> None:
    """PUT this rank's info (retried while the server starts); RuntimeError when refused."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r = requests.put(f"{bootstrap_url}/route", json=info.to_json(), timeout=HTTP_TIMEOUT_S)
            if r.status_code == 200:
                return
            raise RuntimeError(f"bootstrap server {bootstrap_url} refused rank {info.key}: {r.text}")
        except requests.RequestException as err:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot reach the bootstrap server at {bootstrap_url}: {err}") from err
            time.sleep(0.2)


def query_topology(bootstrap_url: str) -> Optional[PrefillTopology]:
    """The prefill server's ranks, or None while not all have registered. Raises
    requests.RequestException when the server cannot be reached."""
    r = requests.get(f"{bootstrap_url}/route", timeout=HTTP_TIMEOUT_S)
    r.raise_for_status()
    body = r.json()
    if not body.get("complete"):
        return None
    return PrefillTopology(tuple(PrefillRankInfo.from_json(d) for d in body["ranks"]))


def is_alive(bootstrap_url: str) -> bool:
    try:
        return requests.get(f"{bootstrap_url}/health", timeout=HTTP_TIMEOUT_S / 2).status_code == 200
    except requests.RequestException:
        return False


class HttpBootstrapClient(BaseBootstrapClient):
    """The calls above, as a transfer backend makes them."""

    def register_rank(self, url: str, info: PrefillRankInfo) -> None:
        register_rank(url, info)

    def query_topology(self, url: str) -> Optional[PrefillTopology]:
        try:
            return query_topology(url)
        except requests.RequestException:
            return None

    def is_alive(self, url: str) -> bool:
        return is_alive(url)
