"""The CPU kernels run without the GIL (sglang_cpu_ops.cpp: py::call_guard), on every build this
CPU runs: another Python thread of the process (HiCache's storage prefetch) runs while a kernel
does. With the GIL held through the call, the main thread below could not take a single step
before the kernel returned."""

from __future__ import annotations

import torch

from sglang.test.gil_probe import steps_during as _steps_during


def test_the_probe_tells_a_held_gil_from_a_released_one():
    """The same native sleep called holding the GIL (ctypes.PyDLL) and releasing it (ctypes.CDLL)."""
    import ctypes

    held, released = ctypes.PyDLL("libc.so.6").usleep, ctypes.CDLL("libc.so.6").usleep
    assert _steps_during(lambda: held(20_000)) == 0
    assert _steps_during(lambda: released(20_000)) > 0


def test_kernels_release_the_gil(ops):
    x, w = torch.randn(4096, 2048), torch.ones(2048)
    gate = torch.randn(2048, 4096)
    ops.rms_norm(x, w, 1e-6)  # warm (allocation, first touch)
    # the control: pure Python holds the GIL (no switch within 0.2 s), so the main thread waits
    assert _steps_during(lambda: sum(range(200_000))) == 0
    steps = [_steps_during(lambda: ops.rms_norm(x, w, 1e-6)), _steps_during(lambda: ops.silu_and_mul(gate))]
    assert min(steps) > 0, f"the main thread took {steps} steps during the kernels: they held the GIL"


def test_linear_kernels_release_the_gil(ops):
    """The packed linears too: int8_linear (and the VNNI copy where this CPU runs it), bf16_linear and
    bf16_linear_f32out where the build has them."""
    from sglang.srt.layers.linear_bf16_packed import pack_bf16_kpairs
    from sglang.srt.layers.quantization.w8a8_int8 import channel_quantize_int8, pack_int8_vnni

    n, k = 4096, 1024
    x, w = torch.randn(1024, k), torch.randn(n, k) * 0.05
    packed = pack_int8_vnni(*channel_quantize_int8(w))
    calls = {"int8_linear": lambda: ops.int8_linear(x, *packed, n)}
    if hasattr(ops, "int8_linear_vnni"):
        try:
            ops.int8_linear_vnni(x[:1], *packed, n)
            calls["int8_linear_vnni"] = lambda: ops.int8_linear_vnni(x, *packed, n)
        except RuntimeError:  # this CPU lacks the copy's VNNI
            pass
    if ops.bf16_linear_impl():
        kp, xb = pack_bf16_kpairs(w.bfloat16()), x.bfloat16()
        calls["bf16_linear"] = lambda: ops.bf16_linear(xb, kp, n, None, False)
        if ops.bf16_linear_impl() == "amx":
            calls["bf16_linear_f32out"] = lambda: ops.bf16_linear_f32out(x[:16], kp, n)
    for call in calls.values():
        call()  # warm
    steps = {name: _steps_during(call) for name, call in calls.items()}
    assert min(steps.values()) > 0, f"steps of the main thread during each kernel: {steps}"
