"""bf16_linear's SwiGLU epilogue (`swiglu=True`, kernels/cpu/csrc/bf16_linear.cpp, on AMX tiles and
on the vdpbf16ps path): a [gate; up] weight's call returns silu(gate) * up with the same bits as
the plain call followed by the build's silu_and_mul, for decode and prefill row counts, K off the
32-wide tile step (x copied), odd numbers of gate blocks, biases; refused for halves off the
16-column blocks. `Bf16PackedLinear.swiglu` and
the gate_up layer's `fused_swiglu` take it at any row count (beyond the plain call's row limit
too) and decline elsewhere."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.layers.linear_bf16_packed import Bf16PackedLinear, pack_bf16_kpairs
from sglang.srt.layers.linear_prepack import prepack_linear_weights
from sglang.srt.models.llama import LlamaMLP
from sglang.srt.platforms import get_platform

SHAPES = [(1, 16, 64), (5, 48, 70), (16, 32, 576), (33, 80, 128), (130, 48, 576), (300, 16, 96)]


def _paths(ops) -> list[bool]:
    """use_amx values to test: the AMX tiles where they run here, and the vdpbf16ps path."""
    impl = ops.bf16_linear_impl()
    if impl == "":
        pytest.skip(f"the {ops.isa()} build has no AVX-512 or AVX2: bf16_linear is refused there")
    return [True, False] if impl == "amx" else [False]


def _case(m: int, d: int, k: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(2 * d, k, generator=g) * 0.1).bfloat16()
    x = (torch.randn(m, k, generator=g) * 2).bfloat16()
    b = (torch.randn(2 * d, generator=g) * 0.5).bfloat16() if bias else None
    return x, w, b


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_equals_plain_then_gate(ops, shape, bias):
    m, d, k = shape
    x, w, b = _case(m, d, k, bias)
    kp = pack_bf16_kpairs(w)
    for use_amx in _paths(ops):
        plain = ops.bf16_linear(x, kp, 2 * d, b, use_amx)
        got = ops.bf16_linear(x, kp, 2 * d, b, use_amx, True)
        assert got.shape == (m, d) and got.dtype == torch.bfloat16
        assert torch.equal(got, ops.silu_and_mul(plain)), (
            use_amx,
            (got.float() - ops.silu_and_mul(plain).float()).abs().max(),
        )
        ref = torch.nn.functional.silu(plain[:, :d].float()) * plain[:, d:].float()
        torch.testing.assert_close(got.float(), ref, rtol=2**-7, atol=1e-5)


def test_swiglu_refusals(ops):
    if not ops.bf16_linear_impl():
        pytest.skip("this build has no bf16_linear")
    x, w, _ = _case(4, 16, 64, False)
    kp = pack_bf16_kpairs(w)
    assert ops.bf16_linear(x, kp, 32, None, False, True).shape == (4, 16)  # the vdpbf16ps path has it too
    w48 = torch.randn(48, 64).bfloat16()
    for use_amx in (True, False):
        with pytest.raises(RuntimeError, match="multiple of 32"):
            ops.bf16_linear(x, pack_bf16_kpairs(w48), 48, None, use_amx, True)


def test_packed_kernel_takes_the_gate_beyond_the_plain_row_limit(ops):
    _paths(ops)
    kernel = Bf16PackedLinear(ops.bf16_linear, max_rows=40)  # the plain call's row limit
    x, w, b = _case(41, 32, 64, True)
    packed = kernel.pack(w)
    want = ops.silu_and_mul(ops.bf16_linear(x, packed[0], 64, b))  # the kernel's own plain call
    assert torch.equal(kernel.swiglu(x[:40], packed, b), want[:40])
    assert torch.equal(kernel.swiglu(x, packed, b), want)  # 41 rows: the plain call runs F.linear
    assert kernel.swiglu(x.float(), packed, None) is None
    assert kernel.swiglu(x[:0], packed, b) is None
    w48 = torch.randn(48, 64).bfloat16()
    assert kernel.swiglu(x[:4], kernel.pack(w48), None) is None


def test_llama_mlp_fuses_the_gate_where_the_kernel_has_it():
    platform = get_platform("cpu")
    mlp = LlamaMLP(128, 96, None, torch.bfloat16, bias=False)
    for p in mlp.parameters():
        p.data.normal_(0, 0.05)
    prepack_linear_weights(mlp, platform)
    kernel = mlp.gate_up_proj.packed_weight[1] if mlp.gate_up_proj.packed_weight else None
    x = torch.randn(2, 7, 128).bfloat16()
    fused = mlp.gate_up_proj.fused_swiglu(x)
    if not isinstance(kernel, Bf16PackedLinear):
        assert fused is None  # oneDNN's copy or none: the layer and the gate run apart
        return
    apart = mlp.act_fn(mlp.gate_up_proj(x).view(14, 192)).view(2, 7, 96)
    assert fused is not None and torch.equal(fused, apart)
    assert torch.equal(mlp(x), mlp.down_proj(apart))
    assert mlp.gate_up_proj.fused_swiglu(x.float()) is None
