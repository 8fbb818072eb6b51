"""Whether a call holds the GIL: the Python steps the main thread takes while another thread runs
it (0 when the call holds the GIL throughout; the kernels' tests: test/unit/test_cpu_kernels_gil.py,
test/kernels_npu/test_dsa_ops_gil.py)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

SWITCH_S = 5.0  # the GIL's forced-switch interval while probing: a held GIL is never taken from the worker
MIN_S = 0.1  # the worker repeats the call for this long: the main thread gets a core meanwhile, even on a busy box


def steps_during(call: Callable[[], object]) -> int:
    """Python steps the main thread takes while another thread runs `call` (repeated for at least
    MIN_S; every run of it, and the loop around them, well within SWITCH_S)."""
    started, done = threading.Event(), threading.Event()

    def work() -> None:
        started.set()
        t0 = time.perf_counter()
        while True:
            call()
            if time.perf_counter() - t0 >= MIN_S:
                break
        done.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)
    try:
        worker = threading.Thread(target=work)
        worker.start()
        started.wait()
        steps = 0
        while not done.is_set():
            steps += 1
            time.sleep(0.0005)  # lets the GIL go: the worker takes it back when its call returns
        worker.join()
    finally:
        sys.setswitchinterval(old)
    return steps
