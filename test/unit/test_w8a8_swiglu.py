"""The W8A8 gate_up layer's fused SwiGLU (`MergedColumnParallelLinear.fused_swiglu`, W8A8's
`apply_swiglu`): LlamaMLP takes it where the kernel build has int8_linear, with the same bits as
the layer followed by SiluAndMul; it declines (None, the caller runs both) for float32 x, float
layers, halves off the 16-column blocks and unpacked weights. The kernel itself:
test_cpu_int8_swiglu.py."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.layers.linear import MergedColumnParallelLinear
from sglang.srt.layers.linear_prepack import prepack_linear_weights
from sglang.srt.layers.quantization.w8a8_int8 import W8A8Int8LinearMethod, channel_quantize_int8
from sglang.srt.models.llama import LlamaMLP
from sglang.srt.platforms import get_platform

needs_kernels = pytest.mark.skipif(
    get_platform("cpu").kernels.fused() is None, reason="no CPU kernel build here (the fused path needs one)"
)


def _quantize(layer, seed: int) -> None:
    W8A8Int8LinearMethod().create_weights(layer, "layer")
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(layer.weight.shape, generator=g) * 0.05
    wq, ws = channel_quantize_int8(w)
    layer.weight.data.copy_(wq)
    layer.weight_scale.data.copy_(ws)


def _mlp(hidden: int, inter: int) -> LlamaMLP:
    mlp = LlamaMLP(hidden, inter, None, torch.bfloat16, bias=False)
    _quantize(mlp.gate_up_proj, 1)
    _quantize(mlp.down_proj, 2)
    prepack_linear_weights(mlp, get_platform("cpu"))
    return mlp


@needs_kernels
@pytest.mark.parametrize("rows", [1, 7, 40])
def test_mlp_takes_the_fused_gate_with_the_same_bits(rows):
    mlp = _mlp(128, 96)
    x = torch.randn(rows, 128).bfloat16()
    fused = mlp.gate_up_proj.fused_swiglu(x)
    assert fused is not None and fused.shape == (rows, 96)
    apart = mlp.act_fn(mlp.gate_up_proj(x))
    assert torch.equal(fused, apart)
    assert torch.equal(mlp(x), mlp.down_proj(apart))
    x3 = x.view(1, rows, 128)  # leading dims kept
    assert mlp.gate_up_proj.fused_swiglu(x3).shape == (1, rows, 96)


@needs_kernels
def test_fused_gate_declines_where_it_cannot_run():
    mlp = _mlp(128, 96)
    assert mlp.gate_up_proj.fused_swiglu(torch.randn(3, 128)) is None  # float32 x
    assert mlp.gate_up_proj.fused_swiglu(torch.randn(0, 128).bfloat16()) is None
    odd = _mlp(64, 40)  # halves of 40 columns: not whole 16-column blocks
    assert odd.gate_up_proj.fused_swiglu(torch.randn(3, 64).bfloat16()) is None
    x = torch.randn(3, 64).bfloat16()
    assert torch.equal(odd(x), odd.down_proj(odd.act_fn(odd.gate_up_proj(x))))


def test_float_and_unpacked_layers_decline():
    plain = MergedColumnParallelLinear(64, [32, 32], False, None, torch.bfloat16)
    assert plain.fused_swiglu(torch.randn(2, 64).bfloat16()) is None  # no quant method
    unpacked = MergedColumnParallelLinear(64, [32, 32], False, None, torch.bfloat16)
    _quantize(unpacked, 3)  # never packed: the torch path
    assert unpacked.fused_swiglu(torch.randn(2, 64).bfloat16()) is None
