"""Fixtures shared by the CPU kernel tests of this folder."""

from __future__ import annotations

import pytest

from sglang.srt.kernels.cpu import isa, loader


@pytest.fixture(scope="module", params=[v.name for v in isa.runnable_variants()])
def ops(request):
    """Each kernel build this CPU runs (a missing one is skipped here: test_cpu_kernels.py, whose own
    `ops` fails for it, is the check that every build is there)."""
    result = loader.load_variant(request.param)
    if result.module is None:
        pytest.skip(f"CPU kernels: {result.reason} (test_cpu_kernels.py fails for a missing build)")
    return result.module
