"""Markers by folder: every test under test/distributed is `distributed`, under test/e2e and
test/reliability `e2e` (pytest.ini declares them; `slow` is set per test or module where it is long)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# OpenMP threads that finished their share of an op sleep instead of spinning for the next one.
# The suite runs two xdist workers, each with servers and ranks of up to 2 torch threads, on 2
# cores: spinning threads burn the cores the others wait for. Measured on one SmolLM2 parity test
# (transformers + the scheduler, 2 threads) on the shared VM: 113.7 CPU-s spinning (libgomp's
# default), 44.2 CPU-s passive, and less wall time too (docs/notes/2026-11-test-time.md). Set here,
# before any test imports torch; servers and ranks the tests start inherit it. Not set by the
# engine itself: a server alone on its cores gains from the spin.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# A guard only: CP tests use prompts of tens of tokens to test the split path, and the CPU
# platform's default `cp_min_split_tokens` is already 0 (always split), so nothing depends on this
# today; it keeps those prompts split should the CPU default ever become a crossover length
# (--cp-min-split-tokens). Tests of that choice pass the flag themselves.
os.environ.setdefault("SGLANG_CP_MIN_SPLIT_TOKENS", "0")

# Servers and engines the tests start do not warm their KV pools' first GiBs in the background
# (mem_cache/kv_warm.py): up to 2 GiB committed per server on a 2-core, 24 GiB box running two
# workers. test/unit/test_kv_warm.py runs the warmer itself.
os.environ.setdefault("SGLANG_CPU_KV_PREFAULT_GB", "0")

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
