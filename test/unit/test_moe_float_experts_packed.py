"""Float routed experts packed with the dense linears' kernel (`prepack_linear_weights` on a
`FusedMoE`): the expert loop runs each expert's w13 / w2 through the platform's packed linear and,
where that kernel has one, the SwiGLU gate in w13's epilogue. A platform double with an exact
kernel (F.linear on a copy) checks the wiring bit for bit; this CPU's own bf16 kernel (where it packs bf16)
within bf16 rounding of the plain loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.linear_prepack import prepack_linear_weights
from sglang.srt.layers.moe.experts import FusedMoE
from sglang.srt.layers.quantization.w8a8_moe import W8A8Int8MoEMethod
from sglang.srt.platforms import get_platform

EXPERTS, HIDDEN, INTER, TOPK = 4, 64, 48, 2  # w13: 96 rows = 6 whole 16-column blocks


def _moe(dtype: torch.dtype, seed: int = 0) -> FusedMoE:
    moe = FusedMoE(EXPERTS, HIDDEN, INTER, None, None, dtype)
    g = torch.Generator().manual_seed(seed)
    for w in (moe.w13_weight, moe.w2_weight):
        w.data.copy_((torch.randn(w.shape, generator=g) * 0.1).to(dtype))
    return moe


def _route(tokens: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOPK] for _ in range(tokens)])
    return torch.rand(tokens, TOPK, generator=g), ids


class _CopyPlatform:
    """A platform whose packed linear is F.linear on a copy of the weight (the plain loop's bits),
    counting the calls; `gate`: its kernel has the fused-gate entry too."""

    name = "test"

    def __init__(self, gate: bool):
        self.calls = {"linear": 0, "swiglu": 0}
        calls = self.calls

        def linear(x, packed, bias):
            calls["linear"] += 1
            return F.linear(x, packed, bias)

        def swiglu(x, packed, bias):
            calls["swiglu"] += 1
            gu = F.linear(x, packed, bias)
            return F.silu(gu[:, : gu.shape[1] // 2]) * gu[:, gu.shape[1] // 2 :]

        class Kernel:
            __call__ = staticmethod(linear)

        if gate:
            Kernel.swiglu = staticmethod(swiglu)
        self.kernel = Kernel()

    def prepacked_linear(self, dtype, device):
        return (lambda w: w.clone()), self.kernel


@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("tokens", [1, 7, 40])
def test_packed_float_experts_give_the_plain_loops_bits(gate, tokens):
    moe = _moe(torch.float32)
    x = torch.randn(tokens, HIDDEN)
    weights, ids = _route(tokens)
    want = moe(x, weights, ids)
    platform = _CopyPlatform(gate)
    nbytes = prepack_linear_weights(nn.ModuleDict({"experts": moe}), platform)
    assert nbytes == (moe.w13_weight.numel() + moe.w2_weight.numel()) * 4
    packed, _ = moe.packed_experts
    assert len(packed) == EXPERTS and packed[0][0].shape == (2 * INTER, HIDDEN)
    assert torch.equal(moe(x, weights, ids), want)
    used = len(set(ids.reshape(-1).tolist()))
    if gate:  # per expert used: the gated w13, then w2
        assert platform.calls == {"linear": used, "swiglu": used}
    else:
        assert platform.calls == {"linear": 2 * used, "swiglu": 0}


def test_other_dtypes_and_quantized_experts_stay_plain():
    moe = _moe(torch.float32)
    platform = _CopyPlatform(True)
    prepack_linear_weights(nn.ModuleDict({"experts": moe}), platform)
    x = torch.randn(3, HIDDEN).double()  # not the weights' dtype: the plain loop
    weights, ids = _route(3)
    with pytest.raises(RuntimeError):  # F.linear refuses the mixed dtypes, as before packing
        moe(x, weights, ids)
    assert platform.calls == {"linear": 0, "swiglu": 0}
    quantized = FusedMoE(EXPERTS, HIDDEN, INTER, None, None, torch.bfloat16)
    W8A8Int8MoEMethod().create_weights(quantized)
    prepack_linear_weights(nn.ModuleDict({"experts": quantized}), platform)
    assert quantized.packed_experts is None


def test_packed_copies_count_against_the_budget():
    moe = _moe(torch.float32)
    assert prepack_linear_weights(nn.ModuleDict({"experts": moe}), _CopyPlatform(True), max_bytes=1000) == 0
    assert moe.packed_experts is None


@pytest.mark.parametrize("tokens", [1, 9, 300])
def test_bf16_experts_on_this_cpus_packed_linear(tokens):
    platform = get_platform("cpu")
    if platform.prepacked_linear(torch.bfloat16, torch.device("cpu")) is None:
        pytest.skip("this CPU's platform packs no bf16 linears")
    moe = _moe(torch.bfloat16)
    x = torch.randn(tokens, HIDDEN).bfloat16()
    weights, ids = _route(tokens)
    want = moe(x, weights, ids)
    prepack_linear_weights(nn.ModuleDict({"experts": moe}), platform)
    assert moe.packed_experts is not None
    got = moe(x, weights, ids)
    # float32 sums in another order and, with the fused gate, one bf16 rounding of h fewer
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert got.abs().sum() > 0


@pytest.mark.parametrize("tokens", [1, 3, 21, 40])
@pytest.mark.parametrize("expert_start, num_local", [(0, 8), (2, 3), (6, 2)])
def test_expert_order_small_path_matches_the_torch_path(tokens, expert_start, num_local, monkeypatch):
    """Decode-sized routings are sorted in Python: the same pairs, order and counts as the torch
    path (ep ranks holding some experts only included), and the loop's result bit for bit."""
    from sglang.srt.layers.moe import experts

    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(8, generator=g)[:3] for _ in range(tokens)])
    small = experts.expert_order(ids, expert_start, num_local)
    monkeypatch.setattr(experts, "SMALL_ROUTE", 0)
    big = experts.expert_order(ids, expert_start, num_local)
    assert torch.equal(small[0], big[0]) and small[1] == big[1]
    assert sum(small[1]) == int(((ids >= expert_start) & (ids < expert_start + num_local)).sum())
    x = torch.randn(tokens, 16, generator=g)
    w13 = torch.randn(num_local, 24, 16, generator=g)
    w2 = torch.randn(num_local, 16, 12, generator=g)
    weights = torch.rand(tokens, 3, generator=g)
    plain = experts.fused_experts_ref(x, w13, w2, weights, ids, expert_start)
    monkeypatch.setattr(experts, "SMALL_ROUTE", 64)
    assert torch.equal(experts.fused_experts_ref(x, w13, w2, weights, ids, expert_start), plain)
