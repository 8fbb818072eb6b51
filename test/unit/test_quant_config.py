"""quantization_config / --quantization refusals, FP8 block (de)quantization, and FP8 linears
sharded over tp ranks (scale blocks shard with the weight; a shard inside a block is refused)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang.srt.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear, RowParallelLinear
from sglang.srt.layers.quantization.config import QuantSpec, quant_spec_from_config
from sglang.srt.layers.quantization.fp8_block import (
    FP8_DTYPE,
    Fp8BlockLinearMethod,
    block_dequant,
    block_quantize,
    fp8_block_linear,
    is_power_of_two,
)

FP8_CFG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "weight_block_size": [128, 128],
    "activation_scheme": "dynamic",
}


def test_quant_config_accepts_fp8_and_refuses_others():
    assert quant_spec_from_config({"quantization_config": FP8_CFG}) == QuantSpec("fp8", (128, 128))
    assert quant_spec_from_config({"quantization_config": FP8_CFG}, "fp8").method == "fp8"
    assert quant_spec_from_config({}) is None
    for method in ("awq", "gptq", "bitsandbytes"):
        with pytest.raises(
            ValueError, match=rf"quant_method '{method}' is not supported; supported: fp8 .*, w8a8_int8"
        ):
            quant_spec_from_config({"quantization_config": {"quant_method": method}})
    with pytest.raises(ValueError, match="w8a8_fp8: not built yet \\(issue 30\\)"):
        quant_spec_from_config({"quantization_config": FP8_CFG}, "w8a8_fp8")
    with pytest.raises(
        ValueError, match="--quantization w8a8_int8 does not match the checkpoint's quant_method 'fp8'"
    ):
        quant_spec_from_config({"quantization_config": FP8_CFG}, "w8a8_int8")
    with pytest.raises(ValueError, match="--quantization fp8 does not match .* not quantized"):
        quant_spec_from_config({}, "fp8")
    with pytest.raises(ValueError, match="weight_block_size"):
        quant_spec_from_config({"quantization_config": {"quant_method": "fp8"}})


def test_fp8_scale_fmt_and_activation_scheme():
    """V3.1 / V3.2's `scale_fmt: ue8m0` is accepted (and kept in the spec, checked at load); another
    scale format, or static activation scales, are refused by name."""
    spec = quant_spec_from_config({"quantization_config": {**FP8_CFG, "scale_fmt": "ue8m0"}})
    assert spec.method == "fp8" and spec.scale_fmt == "ue8m0"
    assert quant_spec_from_config({"quantization_config": FP8_CFG}).scale_fmt is None
    with pytest.raises(ValueError, match="fp8 scale_fmt 'e5m2' is not supported"):
        quant_spec_from_config({"quantization_config": {**FP8_CFG, "scale_fmt": "e5m2"}})
    with pytest.raises(ValueError, match="fp8 activation_scheme 'static' is not supported"):
        quant_spec_from_config({"quantization_config": {**FP8_CFG, "activation_scheme": "static"}})


def test_ue8m0_block_quantize_rounds_scales_up_to_powers_of_two():
    torch.manual_seed(5)
    w = torch.randn(48, 40) * 0.7
    q, s = block_quantize(w, (16, 16), "ue8m0")
    q0, s0 = block_quantize(w, (16, 16))
    assert is_power_of_two(s) and not is_power_of_two(s0)
    assert bool((s >= s0).all()) and bool((s < 2 * s0).all())  # rounded up: no block saturates
    assert float(q.float().abs().max()) <= 448.0
    assert float((block_dequant(q, s, (16, 16)) - w).abs().max()) <= float(w.abs().max()) * 2**-2


def test_deepseek_model_refuses_unsupported_method_before_loading():
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

    config = SimpleNamespace(quantization_config={"quant_method": "gptq"})
    with pytest.raises(ValueError, match="'gptq' is not supported"):
        DeepseekV3ForCausalLM(config)


@pytest.mark.parametrize(
    "shape, block", [((40, 64), (16, 16)), ((37, 53), (16, 8)), ((256, 128), (128, 128))]
)
def test_block_quantize_roundtrip(shape, block):
    torch.manual_seed(0)
    w = torch.randn(shape) * 0.3
    q, s = block_quantize(w, block)
    assert q.dtype == FP8_DTYPE and s.shape == (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    # the first block's largest magnitude maps to 448 exactly (scale_inv = amax / 448)
    assert float(q[: block[0], : block[1]].float().abs().max()) == 448.0
    deq = block_dequant(q, s, block)
    assert float((deq - w).abs().max()) <= float(w.abs().max()) * 2**-3  # e4m3: 3 mantissa bits
    ref = q.float() * s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[: shape[0], : shape[1]]
    assert torch.equal(deq, ref)


def test_tiled_linear_equals_full_dequant():
    torch.manual_seed(1)
    q, s = block_quantize(torch.randn(70, 48), (16, 16))
    x = torch.randn(5, 48)
    bias = torch.randn(70)
    full = x @ block_dequant(q, s, (16, 16)).T + bias
    for tile in (16, 32, 1024):  # several tiles, and a last partial block
        assert torch.allclose(fp8_block_linear(x, q, s, (16, 16), bias, tile_rows=tile), full, atol=1e-5)


def _tp(rank: int, size: int = 2):
    return SimpleNamespace(rank=rank, size=size)


def _fp8_layer(cls, rank, *args):
    layer = cls(*args, tp=_tp(rank))
    Fp8BlockLinearMethod((16, 16)).create_weights(layer, "layer")
    return layer


def test_fp8_tp_shards_match_full_layer():
    torch.manual_seed(2)
    block = (16, 16)
    q, s = block_quantize(torch.randn(64, 96), block)
    x = torch.randn(3, 96)
    full = x @ block_dequant(q, s, block).T
    cols = []
    for rank in range(2):  # column parallel: output rows and scale rows split
        layer = _fp8_layer(ColumnParallelLinear, rank, 96, 64)
        layer.weight.weight_loader(layer.weight, q)
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s)
        assert layer.weight.dtype == FP8_DTYPE and layer.weight_scale_inv.shape == (2, 6)
        cols.append(layer(x))
    assert torch.allclose(torch.cat(cols, -1), full, atol=1e-5)
    partial = 0
    for rank in range(2):  # row parallel: input columns and scale columns split; partial sums add up
        layer = _fp8_layer(RowParallelLinear, rank, 96, 64)
        layer.weight.weight_loader(layer.weight, q)
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s)
        partial = partial + layer.quant_method.apply(layer, x[:, rank * 48 : (rank + 1) * 48], None)
    assert torch.allclose(partial, full, atol=1e-5)


def test_fp8_merged_shards_and_refusal():
    torch.manual_seed(3)
    block = (16, 16)
    gate, up = (block_quantize(torch.randn(64, 32), block) for _ in range(2))
    x = torch.randn(2, 32)
    for rank in range(2):
        layer = _fp8_layer(MergedColumnParallelLinear, rank, 32, [64, 64])
        for i, (q, s) in enumerate((gate, up)):
            layer.weight.weight_loader(layer.weight, q, i)
            layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s, i)
        want = torch.cat(
            [(x @ block_dequant(q, s, block).T)[:, rank * 32 : (rank + 1) * 32] for q, s in (gate, up)], -1
        )
        assert torch.allclose(layer(x), want, atol=1e-5)
    with pytest.raises(ValueError, match="output shard of 24 .* not a multiple of the FP8 weight block 16"):
        _fp8_layer(ColumnParallelLinear, 0, 32, 48)
    with pytest.raises(ValueError, match="input shard of 8 .* not a multiple"):
        _fp8_layer(RowParallelLinear, 0, 16, 32)


def test_quantization_flag_checked_against_checkpoint_at_startup():
    from sglang.srt.configs.startup_checks import check_server_args_against_model
    from sglang.srt.server_args import ServerArgs
    from sglang.test.tiny_models import TINY_LLAMA_DIR

    args = ServerArgs(model_path=TINY_LLAMA_DIR, quantization="fp8")
    with pytest.raises(
        ValueError, match="--quantization fp8 does not match the checkpoint, which is not quantized"
    ):
        check_server_args_against_model(args)
    with pytest.raises(ValueError, match="online quantization is built for w8a8_int8 only"):
        check_server_args_against_model(ServerArgs(model_path=TINY_LLAMA_DIR, quantization="fp8"))
    check_server_args_against_model(ServerArgs(model_path=TINY_LLAMA_DIR, quantization="w8a8_int8"))  # online


def test_checkpoint_stream_makes_linears_fp8_and_pairs_the_rest():
    from torch import nn

    from sglang.srt.layers.linear import ReplicatedLinear
    from sglang.srt.layers.quantization.fp8_load import Fp8CheckpointStream, refuse_scales

    with pytest.raises(
        ValueError, match="block scale in a checkpoint whose config.json has no quantization_config"
    ):
        list(refuse_scales([("model.layers.0.mlp.down_proj.weight_scale_inv", torch.ones(1, 1))]))
    model = nn.Module()
    model.proj = ReplicatedLinear(32, 32)
    model.kv_b_proj = ReplicatedLinear(32, 32)
    model.fp8_unquantized_modules = ("kv_b_proj",)
    q, s = block_quantize(torch.randn(32, 32), (16, 16))
    params = dict(model.named_parameters())
    stream = Fp8CheckpointStream(model, QuantSpec("fp8", (16, 16)), (), lambda i: True, params)
    out = list(stream([("proj.weight", q), ("kv_b_proj.weight", q), ("kv_b_proj.weight_scale_inv", s)]))
    assert [n for n, _ in out] == ["proj.weight", "kv_b_proj.weight"]
    assert out[0][1].dtype == FP8_DTYPE and torch.equal(out[1][1], block_dequant(q, s, (16, 16)))
    assert (
        model.proj.weight.dtype == FP8_DTYPE
        and params["proj.weight_scale_inv"] is model.proj.weight_scale_inv
    )
    assert model.kv_b_proj.weight.dtype == torch.float32  # read as a tensor by its model: widened at load
    stream = Fp8CheckpointStream(model, QuantSpec("fp8", (16, 16)), (), lambda i: True, params)
    with pytest.raises(ValueError, match="FP8 weights without their scale"):
        list(stream([("kv_b_proj.weight", q)]))
