"""Waiting helpers shared by the test suites that drive servers (test/e2e, test/reliability,
test/disaggregation)."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll `predicate` every `interval` seconds until it is true or `timeout` seconds passed;
    returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
