"""`--dtype auto` on a CPU without native bf16 (AVX2 flags simulated): the embedded SmolLM2 runs in
float32 with bf16 weight copies for single-sequence decode (layers/linear_mixed.py), says so in its
log, and gives the same greedy tokens as plain float32 for a few prompts decoded one at a time
(every decode step through the bf16 copies), prefilled in chunks (with the machine's own kernel build,
which has no AVX2 FMA bf16 linear). With native bf16, auto is bf16 (AVX512-BF16 without AMX: float32
GEMMs for prefill-sized linears), and so is AVX2 with its own kernel build."""

from __future__ import annotations

import logging

import pytest
import torch

from sglang.srt.layers import linear_mixed
from sglang.srt.model_loader.default_model import find_default_model
from sglang.srt.platforms import get_platform
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.scheduler_harness import SchedulerHarness

PROMPTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    (
        "Paris is the capital and largest city of France. With an estimated population of over two "
        "million residents, it is the centre of the Ile-de-France region. Since the 17th century Paris "
        "has been one of the world's major centres of finance, diplomacy, commerce, culture, fashion and "
        "gastronomy. "
    )
    * 2
    + "In one sentence, the most famous landmark of Paris is",
]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def prompts_ids():
    path = find_default_model()
    tok = get_tokenizer(path)
    return path, [tok.encode(p, add_special_tokens=False) for p in PROMPTS]


def _greedy(path, prompts, dtype, **kwargs):
    """Each prompt alone (decode batches of one sequence: the bf16-copy path of auto)."""
    h = SchedulerHarness(model_path=path, dtype=dtype, max_total_tokens=4096, num_threads=2, **kwargs)
    out = []
    for ids in prompts:
        rid = h.submit(ids, NEW_TOKENS)
        h.run()
        out.append(h.outputs[rid])
    return h, out


@pytest.fixture
def avx2(monkeypatch):
    """(The test's platform objects are its own: test/conftest.py.)"""
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", "avx2")


@pytest.mark.parametrize("chunk", [64])
def test_auto_on_avx2_is_float32_with_bf16_decode_and_matches_float32(prompts_ids, avx2, caplog, chunk):
    path, prompts = prompts_ids
    assert max(len(p) for p in prompts) > 100
    kwargs = {"chunked_prefill_size": chunk} if chunk else {}
    caplog.set_level(logging.INFO)
    h, auto_ids = _greedy(path, prompts, "auto", **kwargs)
    lines = [r.getMessage() for r in caplog.records if "--dtype auto on this CPU" in r.getMessage()]
    assert len(lines) == 1 and "(avx2): float32 + bf16 weight copies" in lines[0]
    model = h.scheduler.runner.model
    assert next(model.parameters()).dtype == torch.float32
    packed = [m.packed_weight for m in model.modules() if getattr(m, "packed_weight", None) is not None]
    assert len(packed) > 4 * 30  # every linear of the 30 layers, and the LM head
    assert all(isinstance(p[0], linear_mixed.MixedWeight) and p[0].bf16 is not None for p in packed)
    assert all(p[1] is linear_mixed.mixed_linear for p in packed)
    assert get_platform("cpu").dtype_choice.kind == "avx2"  # the choice is the process's CPU platform's
    _, f32_ids = _greedy(path, prompts, "float32", **kwargs)
    assert get_platform("cpu").dtype_choice is None  # an explicit dtype drops it
    assert auto_ids == f32_ids


@pytest.mark.parametrize("kind", ["avx512-bf16", "avx2"])  # amx: plain bf16, test_smollm2_gguf.py
def test_auto_with_native_bf16_is_bf16(prompts_ids, monkeypatch, kind):
    """AMX: plain bf16; AVX512-BF16 without AMX, and AVX2 with its kernel build (the FMA bf16
    linear, platforms/cpu.py): bf16 with float32 copies for prefill-sized linears; all give the
    peers' greedy ids for the "Paris" prompt (whole prompt, then one-token decodes)."""
    monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", kind)
    if kind == "avx2":
        from sglang.srt.kernels.cpu import isa

        if "avx2" not in [v.name for v in isa.runnable_variants()]:
            pytest.skip("this CPU does not run the avx2 kernel build")
        monkeypatch.setenv("SGLANG_CPU_ISA", "avx2")
    path, prompts = prompts_ids
    h, ids = _greedy(path, prompts[:1], "auto")
    model = h.scheduler.runner.model
    assert next(model.parameters()).dtype == torch.bfloat16
    kinds = {
        type(m.packed_weight[0])
        for m in model.modules()
        if isinstance(getattr(m, "packed_weight", None), tuple)
    }
    assert linear_mixed.Float32PrefillWeight in kinds
    assert linear_mixed.MixedWeight not in kinds
    assert ids[0] == [7042, 30, 198, 198, 504, 2988, 314, 42][:NEW_TOKENS]
