"""sgl_kernel_npu's Triton kernels vs the torch reference under Triton's interpreter (CPU, float32).

The cases live in `triton_interpreted_cases.py`; they run in a fresh interpreter process started
with TRITON_INTERPRET=1, because triton decides interpreter vs compiled mode for its own library
functions when it is first imported, and another test of the same pytest process may have imported
it already. We have no GPU / NPU: this checks the kernels' semantics, not their compiled form.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent


def test_triton_kernels_match_reference_under_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cases = HERE / "triton_interpreted_cases.py"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(HERE), str(cases)],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "10 passed" in proc.stdout, proc.stdout[-2000:]
