"""FP8 block-quantized (and W8A8-INT8) routed experts (issue 30): loaded through the checkpoint stream they stay in
1 byte with per-expert block scales, and compute what the torch expert loop computes on the
dequantized weights; experts whose gate / up boundary falls inside a block are widened at load."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sglang.srt.layers.moe.experts import FusedMoE, fused_experts_ref, match_expert_weight
from sglang.srt.layers.quantization.config import QuantSpec
from sglang.srt.layers.quantization.fp8_block import FP8_DTYPE, block_dequant, block_quantize
from sglang.srt.layers.quantization.fp8_load import Fp8CheckpointStream
from sglang.srt.models.weight_loading import load_param

E, H = 4, 48


def _checkpoint(inter: int, block):
    gen = torch.Generator().manual_seed(inter)
    tensors, dense = [], {"w13": [], "w2": []}
    for e in range(E):
        pieces = {}
        for p, shape in (("gate_proj", (inter, H)), ("up_proj", (inter, H)), ("down_proj", (H, inter))):
            q, s = block_quantize(torch.randn(shape, generator=gen) * 0.2, block)
            name = f"mlp.experts.{e}.{p}.weight"
            tensors += [(name, q), (name + "_scale_inv", s)]
            pieces[p] = block_dequant(q, s, block)
        dense["w13"].append(torch.cat([pieces["gate_proj"], pieces["up_proj"]]))
        dense["w2"].append(pieces["down_proj"])
    return tensors, torch.stack(dense["w13"]), torch.stack(dense["w2"])


def _load(inter: int, block):
    model = nn.Module()
    model.mlp = nn.Module()
    model.mlp.experts = FusedMoE(E, H, inter, None, None, torch.float32)
    tensors, w13, w2 = _checkpoint(inter, block)
    params = dict(model.named_parameters())
    stream = Fp8CheckpointStream(model, QuantSpec("fp8", block), (), lambda i: True, params)
    loaded: set[str] = set()
    for name, t in stream(tensors):
        pname, shard = match_expert_weight(name)
        load_param(params, pname, t, shard, loaded)
    return model.mlp.experts, w13, w2


@pytest.mark.parametrize("block", [(16, 16), (16, 32)])
def test_fp8_experts_stay_one_byte_and_match_the_dequantized_loop(block):
    moe, w13, w2 = _load(32, block)
    assert moe.w13_weight.dtype == FP8_DTYPE and moe.w2_weight.dtype == FP8_DTYPE
    assert moe.w13_weight_scale_inv.shape == (E, 64 // block[0], -(-H // block[1]))
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, H, generator=gen)
    ids = torch.randint(0, E, (9, 2), generator=gen)
    weights = torch.rand(9, 2, generator=gen)
    got = moe(x, weights, ids)
    torch.testing.assert_close(got, fused_experts_ref(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)


def test_fp8_experts_across_a_block_are_widened_at_load():
    moe, w13, w2 = _load(24, (16, 16))  # gate / up boundary at row 24: inside a 16-row block
    assert moe.quant_method is None and moe.w13_weight.dtype == torch.float32
    assert torch.equal(moe.w13_weight, w13) and torch.equal(moe.w2_weight, w2)


def test_int8_experts_stay_one_byte_and_match_the_quantized_loop():
    from sglang.srt.layers.quantization.w8a8_int8 import channel_quantize_int8
    from sglang.srt.layers.quantization.w8a8_load import Int8CheckpointStream
    from sglang.test.tiny_w8a8_models import FakeQuantReference

    model = nn.Module()
    model.mlp = nn.Module()
    model.mlp.experts = FusedMoE(E, H, 32, None, None, torch.float32)
    gen = torch.Generator().manual_seed(7)
    tensors, dense = [], {}
    for e in range(E):
        for p, shape in (("gate_proj", (32, H)), ("up_proj", (32, H)), ("down_proj", (H, 32))):
            q, s = channel_quantize_int8(torch.randn(shape, generator=gen) * 0.2)
            tensors += [(f"mlp.experts.{e}.{p}.weight", q), (f"mlp.experts.{e}.{p}.weight_scale", s)]
            dense[(e, p)] = q.float() * s
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, t in Int8CheckpointStream(model, (), lambda i: True, params)(tensors):
        pname, shard = match_expert_weight(name)
        load_param(params, pname, t, shard, loaded)
    moe = model.mlp.experts
    assert moe.w13_weight.dtype == torch.int8 and moe.w2_weight_scale.shape == (E, H, 1)
    x = torch.randn(9, H, generator=gen)
    ids = torch.randint(0, E, (9, 2), generator=gen)
    weights = torch.rand(9, 2, generator=gen)
    got = moe(x, weights, ids)
    ref = FusedMoE(E, H, 32, None, None, torch.float32)
    ref.w13_weight.data.copy_(
        torch.stack([torch.cat([dense[(e, "gate_proj")], dense[(e, "up_proj")]]) for e in range(E)])
    )
    ref.w2_weight.data.copy_(torch.stack([dense[(e, "down_proj")] for e in range(E)]))
    ref.quant_method = FakeQuantReference()
    torch.testing.assert_close(got, ref(x, weights, ids), atol=1e-5, rtol=1e-5)
