"""sgl_kernel_npu's CPU kernels (indexer_topk, sparse_attention, merge_states) run without the GIL
(csrc/cpu/dsa_ops.cpp: py::call_guard), on every build this CPU runs: another Python thread of the
server (HiCache's storage prefetch) runs while they do. The bindings are called directly, with the
arguments the wrappers pass (the wrappers' own torch calls release the GIL); a pure-Python call is
the control that holds it."""

from __future__ import annotations

import pytest
import torch

import sgl_kernel_npu as skn
from dsa_cases import indexer_case, sfa_case
from sgl_kernel_npu import cpu
from sglang.test.gil_probe import steps_during

pytestmark = pytest.mark.skipif(not cpu.available(), reason="sgl_kernel_npu built without its CPU kernels")
KERNELS = ("indexer_topk", "sparse_attention", "merge_states")


def _binding_calls(monkeypatch) -> dict:
    """Each kernel's binding with the arguments its wrapper passed it, from one run of each op."""
    real, seen = cpu._ops, {}

    class Spy:
        def __getattr__(self, name):
            fn = getattr(real, name)
            if name not in KERNELS:
                return fn
            return lambda *args: seen.setdefault(name, (fn, args)) and fn(*args)

    monkeypatch.setattr(cpu, "_ops", Spy())
    ix = indexer_case(q_lens=[64, 1], kv_lens=[2048, 2048], heads=16, dim=64, topk=256, block_size=64, seed=1)
    skn.lightning_indexer(ix.query, ix.key, ix.weights, **ix.kwargs(), impl="cpu")
    q, key, idx, kw = sfa_case(q_lens=[64, 1], kv_lens=[2048, 2048], heads=16, dk=128, dr=32, topk=512)
    skn.sparse_flash_attention(q, key, key, idx, 0.1, **kw, impl="cpu")
    skn.merge_attn_states(
        [torch.randn(16, 8192, 128) for _ in range(2)], [torch.randn(16, 8192)] * 2, impl="cpu"
    )
    monkeypatch.setattr(cpu, "_ops", real)
    assert sorted(seen) == sorted(KERNELS)
    return {name: (lambda fn=fn, args=args: fn(*args)) for name, (fn, args) in seen.items()}


@pytest.mark.parametrize("isa", cpu.supported_isas() if cpu.available() else [])
def test_dsa_kernels_release_the_gil(isa, monkeypatch):
    with cpu.force_isa(isa):
        calls = _binding_calls(monkeypatch)
        assert steps_during(lambda: sum(range(200_000))) == 0  # the control holds the GIL
        steps = {name: steps_during(call) for name, call in calls.items()}
    assert min(steps.values()) > 0, f"steps of the main thread during each kernel: {steps}"
