"""Whether a call holds the GIL: the Python steps the main thread takes while another thread runs
it (0 when the call holds the GIL throughout; the kernels' tests: test/unit/test_cpu_kernels_gil.py,
test/kernels_npu/test_dsa_ops_gil.py)."""

from __future__ import annotations

import sys
import threading
from typing import Callable


def steps_during(call: Callable[[], object]) -> int:
    """Python steps the main thread takes while another thread runs `call` once."""
    started, done = threading.Event(), threading.Event()

    def work() -> None:
        started.set()
        call()
        done.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.2)  # the worker keeps a held GIL for the whole call (it lasts ms)
    try:
        worker = threading.Thread(target=work)
        worker.start()
        started.wait()
        steps = 0
        while not done.is_set():
            steps += 1
        worker.join()
    finally:
        sys.setswitchinterval(old)
    return steps
