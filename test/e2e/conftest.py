"""Server fixtures for the end-to-end tests: one real `python -m sglang.launch_server` subprocess
(tiny Llama, dummy float32 weights, free port, API key) shared by the session.

When a test here fails, look at the server log path printed in the failure message first.
"""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from server_helpers import API_KEY, ServerHandle, launch_server


@pytest.fixture(scope="session")
def server() -> Iterator[ServerHandle]:
    """One shared server for the whole e2e session (with an API key, to exercise auth everywhere)."""
    handle = launch_server(api_key=API_KEY)
    yield handle
    handle.stop()


@pytest.fixture
def client(server: ServerHandle) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c
