"""W8A8-INT8 routed experts on the fused int8 kernel (`W8A8Int8MoEMethod.pack_weights`): after
packing, the plain int8 expert weights are gone (meta) and the expert loop gives the same bits as
the torch path for float32 activations; for bf16 ones the gate runs in w13's epilogue (within one
bf16 rounding of the torch gate). `pack_quantized_linears` finds the experts in a model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sglang.srt.layers.linear_prepack import pack_quantized_linears
from sglang.srt.layers.moe.experts import FusedMoE
from sglang.srt.layers.quantization.w8a8_moe import W8A8Int8MoEMethod
from sglang.srt.platforms import get_platform

pytestmark = pytest.mark.skipif(
    get_platform("cpu").kernels.fused() is None,
    reason="no CPU kernel build here (the packed experts need one)",
)

EXPERTS, HIDDEN, INTER, TOPK = 4, 64, 48, 2  # w13: 96 rows, halves of three 16-column blocks


def _moe(seed: int = 0) -> FusedMoE:
    moe = FusedMoE(EXPERTS, HIDDEN, INTER, None, None, torch.bfloat16)
    W8A8Int8MoEMethod().create_weights(moe)
    g = torch.Generator().manual_seed(seed)
    for w, s in ((moe.w13_weight, moe.w13_weight_scale), (moe.w2_weight, moe.w2_weight_scale)):
        w.data.copy_(torch.randint(-127, 128, w.shape, generator=g, dtype=torch.int8))
        s.data.copy_(torch.rand(s.shape, generator=g) * 1e-3 + 1e-4)
    return moe


def _route(tokens: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOPK] for _ in range(tokens)])
    return torch.rand(tokens, TOPK, generator=g), ids


@pytest.mark.parametrize("tokens", [1, 5, 33])
def test_packed_experts_give_the_torch_paths_bits_in_float32(tokens):
    moe = _moe()
    x = torch.randn(tokens, HIDDEN)
    weights, ids = _route(tokens)
    want = moe(x, weights, ids)
    assert moe.quant_method.pack_weights(moe) is not None
    assert moe.w13_weight.is_meta and moe.w2_weight.is_meta and len(moe.int8_experts) == EXPERTS
    assert torch.equal(moe(x, weights, ids), want)
    assert moe.quant_method.pack_weights(moe) is None  # packed already


@pytest.mark.parametrize("tokens", [1, 5, 33])
def test_bf16_experts_take_the_fused_gate(tokens, monkeypatch):
    moe = _moe()
    x = (torch.randn(tokens, HIDDEN) * 2).bfloat16()
    weights, ids = _route(tokens)
    want = moe(x, weights, ids)
    moe.quant_method.pack_weights(moe)
    from sglang.srt.layers.quantization import w8a8_moe

    calls = []
    real = w8a8_moe.fused_int8_linear

    def counted(*a, **kw):
        calls.append(kw.get("swiglu", False))
        return real(*a, **kw)

    monkeypatch.setattr(w8a8_moe, "fused_int8_linear", counted)
    got = moe(x, weights, ids)
    assert calls.count(True) == calls.count(False) > 0  # per expert: the gated w13, then w2
    # the same int32 sums; the gate's own silu and one bf16 rounding of h differ from torch's
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert not torch.equal(got, torch.zeros_like(got))


def test_float16_experts_run_packed_widened(monkeypatch):
    """float16 activations: each expert's packed weights through the fused kernel on rows widened
    to float32 (none unpacked per call), the torch path's bits."""
    moe = _moe()
    x = torch.randn(7, HIDDEN).half()
    weights, ids = _route(7)
    want = moe(x, weights, ids)
    moe.quant_method.pack_weights(moe)
    from sglang.srt.layers.quantization import w8a8_int8

    monkeypatch.setattr(w8a8_int8, "unpack_int8_vnni", lambda *a: pytest.fail("unpacked per call"))
    got = moe(x, weights, ids)
    assert got.dtype == torch.float16 and torch.equal(got, want)


def test_pack_quantized_linears_finds_routed_experts():
    model = nn.ModuleDict({"experts": _moe()})
    added = pack_quantized_linears(model)
    assert model["experts"].w13_weight.is_meta
    assert added == sum(
        t.numel() * t.element_size() for ex in model["experts"].int8_experts for p in ex for t in p[:3]
    ) - EXPERTS * (2 * INTER * HIDDEN + HIDDEN * INTER)
