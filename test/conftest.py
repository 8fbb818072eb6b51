"""Markers by folder: every test under test/distributed is `distributed`, under test/e2e and
test/reliability `e2e` (pytest.ini declares them; `slow` is set per test or module where it is long)."""

from __future__ import annotations

from pathlib import Path

import pytest

_FOLDER_MARKERS = {
    "distributed": pytest.mark.distributed,
    "e2e": pytest.mark.e2e,
    "reliability": pytest.mark.e2e,
}


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        try:
            folder = Path(item.fspath).relative_to(here).parts[0]
        except ValueError:
            continue
        marker = _FOLDER_MARKERS.get(folder)
        if marker is not None:
            item.add_marker(marker)


@pytest.fixture(autouse=True)
def _fresh_platforms():
    """Every test gets the platform objects a new process would have (`platforms.fresh_platforms`):
    their kernel table and the CPU's `--dtype auto` choice start empty, so what a test resolved or
    loaded (under its own SGLANG_CPU_* variables) stays with it."""
    from sglang.srt.platforms import fresh_platforms

    with fresh_platforms():
        yield
