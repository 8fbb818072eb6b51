"""The CPU kernels run without the GIL (sglang_cpu_ops.cpp: py::call_guard), on every build this
CPU runs: another Python thread of the process (HiCache's storage prefetch) runs while a kernel
does. With the GIL held through the call, the main thread below could not take a single step
before the kernel returned."""

from __future__ import annotations

import sys
import threading

import torch


def _steps_during(call) -> int:
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


def test_kernels_release_the_gil(ops):
    x, w = torch.randn(4096, 2048), torch.ones(2048)
    gate = torch.randn(2048, 4096)
    ops.rms_norm(x, w, 1e-6)  # warm (allocation, first touch)
    # the control: pure Python holds the GIL (no switch within 0.2 s), so the main thread waits
    assert _steps_during(lambda: sum(range(200_000))) == 0
    steps = [_steps_during(lambda: ops.rms_norm(x, w, 1e-6)), _steps_during(lambda: ops.silu_and_mul(gate))]
    assert min(steps) > 0, f"the main thread took {steps} steps during the kernels: they held the GIL"
