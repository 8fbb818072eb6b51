"""Prepacked bf16 linear weights (oneDNN on CPU): same results as F.linear, opt-out by env."""

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.linear import ColumnParallelLinear, RowParallelLinear
from sglang.srt.layers.linear_prepack import linear, prepack_linear_weights
from sglang.srt.layers.vocab_embedding import ParallelLMHead
from sglang.srt.platforms import get_platform

CPU = get_platform("cpu")
needs_packed = pytest.mark.skipif(
    CPU.prepacked_linear(torch.bfloat16, torch.device("cpu")) is None, reason="no oneDNN bf16 on this CPU"
)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.ModuleDict(
        {
            "up": ColumnParallelLinear(64, 96, bias=True, params_dtype=torch.bfloat16),
            "down": RowParallelLinear(96, 64, bias=False, params_dtype=torch.bfloat16),
            "head": ParallelLMHead(200, 64, params_dtype=torch.bfloat16),
        }
    )
    for p in m.parameters():
        p.data.normal_()
    return m


@needs_packed
@pytest.mark.parametrize("shape", [(1, 64), (7, 64), (300, 64), (2, 5, 64)])
def test_packed_layers_match_f_linear(shape):
    m = _model()
    x = torch.randn(*shape).bfloat16()
    ref_up = F.linear(x, m["up"].weight, m["up"].bias)
    ref_down = F.linear(ref_up, m["down"].weight)
    ref_head = F.linear(x.reshape(-1, 64), m["head"].weight)
    nbytes = prepack_linear_weights(m, CPU)
    assert nbytes == sum(m[k].weight.numel() * 2 for k in ("up", "down", "head"))
    assert all(m[k].packed_weight is not None for k in ("up", "down", "head"))
    torch.testing.assert_close(m["up"](x), ref_up, atol=0.05, rtol=0.02)
    torch.testing.assert_close(m["down"](ref_up), ref_down, atol=0.25, rtol=0.02)
    torch.testing.assert_close(
        m["head"].compute_logits(x.reshape(-1, 64))[:, :200], ref_head, atol=0.1, rtol=0.02
    )
    assert "packed" not in " ".join(m.state_dict())  # a plain attribute, not a parameter


def test_float32_and_opt_out_keep_plain_weights(monkeypatch):
    m = _model().float()
    assert prepack_linear_weights(m, CPU) == 0 and m["up"].packed_weight is None  # bf16 only
    monkeypatch.setenv("SGLANG_CPU_PREPACK_LINEAR", "0")
    m = _model()
    assert prepack_linear_weights(m, CPU) == 0 and m["down"].packed_weight is None
    x = torch.randn(3, 64)
    torch.testing.assert_close(
        linear(x, m["up"].weight.float(), None, None), F.linear(x, m["up"].weight.float())
    )


def test_cpu_process_tuning_runs_and_can_be_disabled(monkeypatch):
    # mallopt is process-wide and harmless to repeat; this checks it is callable and gated.
    CPU.configure_process()
    monkeypatch.setenv("SGLANG_CPU_MALLOC_TUNE", "no")
    CPU.configure_process()
    monkeypatch.setenv("SGLANG_CPU_MALLOC_TUNE", "maybe")
    with pytest.raises(ValueError, match="SGLANG_CPU_MALLOC_TUNE"):
        CPU.configure_process()


@needs_packed
def test_nothing_is_packed_past_the_memory_allowance(caplog):
    m = _model()
    with caplog.at_level("WARNING"):
        assert prepack_linear_weights(m, CPU, max_bytes=1000) == 0
    assert m["up"].packed_weight is None and "not prepacking" in caplog.text


@needs_packed
def test_float32_logits_head_takes_no_onednn_copy():
    """With float32 logits switched on before prepacking (ModelRunner's order) the head keeps only
    the float32 kernel's packed copy: the oneDNN copy is not made and not counted."""
    from sglang.srt.layers.linear_float32_out import float32_logits_packing

    m = _model()
    packed = float32_logits_packing(m["head"].weight)
    if packed is None:
        pytest.skip("no linear_f32out_packed kernel here")
    m["head"].set_float32_logits(packed)
    nbytes = prepack_linear_weights(m, CPU)
    assert nbytes == sum(m[k].weight.numel() * 2 for k in ("up", "down"))
    assert m["head"].packed_weight is None and m["up"].packed_weight is not None
    x = torch.randn(4, 64).bfloat16()
    want = x.float() @ m["head"].weight.float().T
    torch.testing.assert_close(m["head"].compute_logits(x), want, atol=1e-4, rtol=1e-5)
