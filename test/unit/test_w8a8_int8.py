"""W8A8-INT8 (issue 30): the checkpoint configs that select it (SGLang's w8a8_int8, compressed-tensors
int8 channel / dynamic token) and the ones refused by name; per-token activation quantization exact
against a reference; the int8 GEMM (torch's, and the exact blockwise fallback) against float math
on odd shapes; the scale sharded with the weight over tp ranks (column, merged, QKV, row)."""

from __future__ import annotations

import copy

import pytest
import torch

from sglang.srt.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from sglang.srt.layers.moe.experts import FusedMoE
from sglang.srt.layers.quantization.config import QuantSpec, quant_spec_from_config
from sglang.srt.layers.quantization.w8a8_int8 import (
    W8A8Int8LinearMethod,
    channel_quantize_int8,
    int8_mm_blockwise,
    per_token_quant_int8,
    w8a8_int8_linear,
)
from sglang.srt.layers.quantization.w8a8_load import Int8CheckpointStream
from sglang.srt.platforms.kernel_dispatch import int8_mm_op
from sglang.test.tiny_w8a8_models import COMPRESSED_TENSORS_W8A8, W8A8_INT8


def test_configs_select_w8a8_int8_and_refuse_other_schemes():
    spec = quant_spec_from_config({"quantization_config": W8A8_INT8})
    assert spec == QuantSpec("w8a8_int8", None, "dynamic", "w8a8_int8")
    spec = quant_spec_from_config({"quantization_config": COMPRESSED_TENSORS_W8A8}, "w8a8_int8")
    assert spec.method == "w8a8_int8" and spec.source == "compressed-tensors"
    with pytest.raises(ValueError, match="--quantization fp8 does not match .* 'w8a8_int8'"):
        quant_spec_from_config({"quantization_config": W8A8_INT8}, "fp8")
    asym = copy.deepcopy(COMPRESSED_TENSORS_W8A8)
    asym["config_groups"]["group_0"]["input_activations"]["symmetric"] = False
    with pytest.raises(ValueError, match="input_activations.symmetric=False is not supported"):
        quant_spec_from_config({"quantization_config": asym})
    w4 = copy.deepcopy(COMPRESSED_TENSORS_W8A8)
    w4["format"] = "pack-quantized"
    with pytest.raises(ValueError, match="format 'pack-quantized' is not supported"):
        quant_spec_from_config({"quantization_config": w4})
    static = copy.deepcopy(COMPRESSED_TENSORS_W8A8)
    static["config_groups"]["group_0"]["input_activations"].update(dynamic=False, strategy="tensor")
    with pytest.raises(ValueError, match="strategy='tensor'.*dynamic=False"):
        quant_spec_from_config({"quantization_config": static})


def test_per_token_quant_exact_against_reference():
    torch.manual_seed(0)
    x = torch.randn(7, 53) * torch.rand(7, 1) * 5
    x[3] = 0  # a zero row: scale 1, all zeros
    q, s = per_token_quant_int8(x)
    for r in range(7):
        amax = float(x[r].abs().max())
        scale = amax / 127 if amax > 0 else 1.0
        assert float(s[r]) == pytest.approx(scale, rel=1e-7)
        assert torch.equal(q[r], torch.round(x[r] / s[r]).clamp(-127, 127).to(torch.int8))
    assert q.abs().max() == 127 and torch.all(q[3] == 0)


@pytest.mark.parametrize("m, n, k", [(1, 37, 53), (5, 130, 2100), (17, 1030, 64)])
def test_int8_gemm_against_float_math(m, n, k):
    gen = torch.Generator().manual_seed(m * n + k)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=gen)
    b = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    ref = a.long() @ b.long().t()
    assert torch.equal(int8_mm_blockwise(a, b.t(), tile_rows=512).long(), ref)  # exact past 2**24
    assert int8_mm_op(torch.device("meta")) is None  # no int8 GEMM there: the fallback
    op = int8_mm_op(torch.device("cpu"))
    if op is not None:
        assert torch.equal(op(a, b.t()).long(), ref)
    x = torch.randn(m, k, dtype=torch.float64).float()
    wq, ws = channel_quantize_int8(torch.randn(n, k) * 0.1)
    xq, xs = per_token_quant_int8(x)
    want = ((xq.double() @ wq.double().t()) * xs.double() * ws.double().t()).float()
    bias = torch.randn(n)
    for mm in (None, int8_mm_blockwise):
        got = w8a8_int8_linear(x.reshape(1, m, k), wq, ws, bias, mm=mm)
        assert got.shape == (1, m, n)
        torch.testing.assert_close(got[0], want + bias, atol=1e-5, rtol=1e-5)
    assert w8a8_int8_linear(torch.zeros(0, k), wq, ws).shape == (0, n)
    assert w8a8_int8_linear(x.bfloat16(), wq, ws).dtype == torch.bfloat16


def _tp(rank: int, size: int = 2):
    from types import SimpleNamespace

    return SimpleNamespace(rank=rank, size=size)


def _load(layer, w, pieces=None):
    """Make `layer` int8 and load the full weight `w` (or its fused pieces {shard_id: w})."""
    W8A8Int8LinearMethod().create_weights(layer, "layer")
    for sid, part in (pieces or {None: w}).items():
        q, s = channel_quantize_int8(part)
        args = () if sid is None else (sid,)
        layer.weight.weight_loader(layer.weight, q, *args)
        layer.weight_scale.weight_loader(layer.weight_scale, s.bfloat16() if sid == 1 else s, *args)
    assert layer.weight.dtype == torch.int8 and layer.weight_scale.shape == (layer.weight.shape[0], 1)
    return layer


def test_int8_tp_shards_match_full_layer():
    torch.manual_seed(1)
    x = torch.randn(3, 32)
    w = torch.randn(48, 32) * 0.2
    full = _load(ReplicatedLinear(32, 48), w)(x)
    cols = [_load(ColumnParallelLinear(32, 48, tp=_tp(r)), w)(x) for r in range(2)]
    torch.testing.assert_close(torch.cat(cols, -1), full, atol=0, rtol=0)
    gate, up = torch.randn(16, 32), torch.randn(32, 32)
    merged_full = _load(MergedColumnParallelLinear(32, [16, 32]), None, {0: gate, 1: up})(x)
    merged = [
        _load(MergedColumnParallelLinear(32, [16, 32], tp=_tp(r)), None, {0: gate, 1: up})(x)
        for r in range(2)
    ]
    want = torch.cat([merged[0][:, :8], merged[1][:, :8], merged[0][:, 8:], merged[1][:, 8:]], -1)
    torch.testing.assert_close(want, merged_full, atol=0, rtol=0)
    q, k, v = torch.randn(32, 32), torch.randn(16, 32), torch.randn(16, 32)
    qkv = [
        _load(QKVParallelLinear(32, 8, 4, 2, tp=_tp(r)), None, {"q": q, "k": k, "v": v})(x) for r in range(2)
    ]
    qkv_full = _load(QKVParallelLinear(32, 8, 4, 2), None, {"q": q, "k": k, "v": v})(x)
    torch.testing.assert_close(
        torch.cat([qkv[0][:, :16], qkv[1][:, :16]], -1), qkv_full[:, :32], atol=0, rtol=0
    )
    w_row = torch.randn(24, 32) * 0.2
    rows = [_load(RowParallelLinear(32, 24, tp=_tp(r)), w_row) for r in range(2)]
    assert torch.equal(rows[0].weight_scale, rows[1].weight_scale)  # the whole scale on each rank
    part = sum(rows[r]._matmul(x[:, 16 * r : 16 * (r + 1)], None) for r in range(2))
    ref = x @ (channel_quantize_int8(w_row)[0].float() * channel_quantize_int8(w_row)[1]).t()
    torch.testing.assert_close(part, ref, atol=0.05, rtol=0.02)  # each rank quantized its own slice


def test_checkpoint_stream_makes_linears_int8_and_widens_the_rest():
    from torch import nn

    from sglang.srt.layers.quantization.fp8_load import refuse_scales

    model = nn.Module()
    model.proj = ReplicatedLinear(32, 16)
    model.kv_b_proj = ReplicatedLinear(32, 16)
    model.fp8_unquantized_modules = ("kv_b_proj",)
    q, s = channel_quantize_int8(torch.randn(16, 32))
    params = dict(model.named_parameters())
    stream = Int8CheckpointStream(model, (), lambda i: True, params)
    got = list(
        stream(
            [
                ("proj.weight", q),
                ("proj.weight_scale", s),
                ("kv_b_proj.weight", q),
                ("kv_b_proj.weight_scale", s),
            ]
        )
    )
    assert [n for n, _ in got] == ["proj.weight", "proj.weight_scale", "kv_b_proj.weight"]
    assert torch.equal(got[2][1], q.float() * s)
    assert model.proj.weight.dtype == torch.int8 and params["proj.weight_scale"] is model.proj.weight_scale
    assert model.kv_b_proj.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="int8 weights without their scale"):
        list(Int8CheckpointStream(model, (), lambda i: True, params)([("kv_b_proj.weight", q)]))
    with pytest.raises(ValueError, match="int8 channel scale in a checkpoint whose config.json has no"):
        list(refuse_scales([("proj.weight_scale", s)]))
    with pytest.raises(ValueError, match="int8 tensor in a checkpoint whose config.json has no"):
        list(refuse_scales([("proj.weight", q)]))


def test_online_quantization_scope_and_refusals():
    from types import SimpleNamespace

    from torch import nn

    from sglang.srt.layers.quantization.online import quantize_online

    model = nn.Module()
    model.config = SimpleNamespace()
    model.layers = nn.ModuleList([nn.Module()])
    model.layers[0].o_proj = ReplicatedLinear(32, 16)
    model.layers[0].kv_b_proj = ReplicatedLinear(32, 16)
    model.lm_head = ReplicatedLinear(32, 16)
    model.fp8_unquantized_modules = ("kv_b_proj",)
    moe = model.layers[0].experts = FusedMoE(4, 32, 16, None, None, torch.float32)
    torch.manual_seed(2)
    moe.w13_weight.data.normal_(0, 0.2)
    moe.w2_weight.data.normal_(0, 0.2)
    x, ids, gates = torch.randn(6, 32), torch.randint(0, 4, (6, 2)), torch.rand(6, 2)
    float_out = moe(x, gates, ids)
    w = model.layers[0].o_proj.weight.detach().clone()
    with pytest.raises(
        ValueError, match="--quantization fp8: online quantization is built for w8a8_int8 only"
    ):
        quantize_online(model, "fp8")
    assert quantize_online(model, None) == 0
    assert quantize_online(model, "w8a8_int8") == 2  # decoder linears and experts; kv_b_proj kept float
    assert moe.w13_weight.dtype == torch.int8 and moe.w2_weight_scale.shape == (4, 32, 1)
    torch.testing.assert_close(moe(x, gates, ids), float_out, atol=0.05, rtol=0.05)
    o = model.layers[0].o_proj
    q, s = channel_quantize_int8(w)
    assert o.weight.dtype == torch.int8 and torch.equal(o.weight, q) and torch.equal(o.weight_scale, s)
    assert (
        model.layers[0].kv_b_proj.weight.dtype == torch.float32
        and model.lm_head.weight.dtype == torch.float32
    )
    model.config = SimpleNamespace(quantization_config=W8A8_INT8)  # a quantized checkpoint: its own format
    assert quantize_online(model, "w8a8_int8") == 0
