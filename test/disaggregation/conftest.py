"""PD tests: markers (the server tests are `slow` and `e2e` by module).

`make setup` leaves the PD extra out where libibverbs cannot be installed (`make setup-pd` adds it
later); there the PD tests are skipped with that reason instead of failing. Where the extra is
installed (CI) nothing is skipped."""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _pd_missing() -> str:
    for module in ("mooncake", "sglang_router"):
        if importlib.util.find_spec(module) is None:
            return f"the PD extra is not installed ({module} missing): make setup-pd"
    try:
        ctypes.CDLL("libibverbs.so.1")
    except OSError:
        return "libibverbs.so.1 is missing: sudo apt-get install -y libibverbs1 ibverbs-providers && make setup-pd"
    return ""


def pytest_collection_modifyitems(config, items):
    reason = _pd_missing()
    if not reason:
        return
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.skip(reason=reason))
