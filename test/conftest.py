"""Markers by folder: every test under test/distributed is `distributed`, under test/e2e and
test/reliability `e2e` (pytest.ini declares them; `slow` is set per test or module where it is long)."""

from __future__ import annotations

from pathlib import Path

import pytest

_FOLDER_MARKERS = {"distributed": pytest.mark.distributed, "e2e": pytest.mark.e2e, "reliability": pytest.mark.e2e}


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
