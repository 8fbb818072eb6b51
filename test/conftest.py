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


@pytest.fixture(autouse=True)
def _forget_cpu_auto_dtype():
    """`--dtype auto` on CPU records its choice per process (platforms/cpu.py: the linears packed
    after loading read it); a test that resolved auto must not change how a later test packs."""
    yield
    from sglang.srt.platforms.cpu import forget_auto_dtype

    forget_auto_dtype()
