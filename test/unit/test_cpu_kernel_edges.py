"""The fused CPU kernels at edge values (signed zeros, denormals, huge values, infinities, NaN) and
sharp / flat attention scores, against their torch references, once per instruction-set build this
CPU runs (the `ops` of conftest.py; test_cpu_kernels.py fails for a missing build); and the builds
without AMX refusing the AMX prefill kernel. Split from test_cpu_kernels.py."""

from __future__ import annotations

import pytest
import torch
from sglang.srt.kernels.cpu import reference as ref
from test_cpu_kernels import TOL, _close

SPECIALS = [
    0.0,
    -0.0,
    1e-40,
    -1e-40,
    1e-30,
    1e19,
    -1e19,
    1e20,
    -1e20,
    3e38,
    -3e38,
    float("inf"),
    float("-inf"),
    float("nan"),
]


def _same_specials(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """NaN and inf exactly where torch has them (with inf's sign); the finite rest close."""
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan()), (got, want)
    assert torch.equal(got.isinf(), want.isinf()) and torch.equal(got[got.isinf()], want[want.isinf()]), (
        got,
        want,
    )
    fin = want.isfinite()
    torch.testing.assert_close(got[fin].float(), want[fin].float(), atol=1e-30, rtol=TOL[dtype])


def _cycle(values: torch.Tensor, shift: int, width: int) -> torch.Tensor:
    return values.roll(shift).repeat(width // len(values) + 1)[:width]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 15, 16, 17, 25, 35, 64])  # around the 8 / 16-lane vector bodies
def test_silu_edge_values_every_width(ops, dtype, width):
    """silu_and_mul on huge, tiny (denormal), signed-zero, infinite and NaN gates and ups, every
    value at every lane position, at row widths around the vector length (AVX-512: vector body
    plus scalar tail)."""
    vals = torch.tensor(SPECIALS + [-200.0, -90.0, -88.5, -87.0, -10.0, -0.5, 0.5, 10.0, 87.0, 89.0, 200.0])
    g = torch.Generator().manual_seed(width)
    rows = [
        torch.cat((_cycle(vals, shift, width), torch.randn(width, generator=g) * 3))
        for shift in range(len(vals))
    ]
    rows += [
        torch.cat((torch.randn(width, generator=g), _cycle(vals, shift, width)))
        for shift in range(0, len(vals), 5)
    ]
    x = torch.stack(rows).to(dtype)
    _same_specials(ops.silu_and_mul(x), ref.silu_and_mul(x), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_edge_values(ops, dtype):
    """Rows of zeros (eps alone), denormals, values whose squares overflow, inf and NaN."""
    n = 40
    g = torch.Generator().manual_seed(5)
    base = torch.randn(8, n, generator=g)
    base[0] = 0.0
    base[1] = 1e-40
    base[2] *= 1e18  # squares near float32's top
    base[3] *= 1e20  # squares overflow to inf: the row's norm is 0 (torch: x * rsqrt(inf))
    base[4, 7] = float("inf")
    base[5, 9] = float("nan")
    base[6, 3] = -3e38
    x = base.to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
    _same_specials(ops.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), dtype)
    r = torch.randn(8, n, generator=g).to(dtype)
    out, res = ops.add_rms_norm(x, r, w, 1e-6)
    want_out, want_res = ref.add_rms_norm(x, r, w, 1e-6)
    _same_specials(res, want_res, dtype)
    _same_specials(out, want_out, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_edge_values(ops, dtype):
    """RoPE with inf / NaN / huge entries in x: they propagate where torch's do."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(3, 2, 48, generator=g)
    x[0, 0, 1] = float("inf")
    x[1, 1, 30] = float("nan")
    x[2, 0, 5] = 1e38
    cos = torch.rand(3, 32, generator=g)
    sin = torch.rand(3, 32, generator=g)
    x, cos, sin = x.to(dtype), cos.to(dtype), sin.to(dtype)
    _same_specials(ops.rope(x, cos, sin, 32), ref.rope(x, cos, sin, 32), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 80])  # the fixed-width paths and the generic one
def test_decode_attention_sharp_and_flat_scores(ops, dtype, head_dim):
    """Softmax extremes: one key far above the rest (it takes all the weight), one key repeated
    (uniform weights), and a long sequence split across tasks and merged by log-sum-exp."""
    g = torch.Generator().manual_seed(head_dim)
    hk, hq, rows = 2, 4, 2100
    k_buf = torch.randn(hk, rows, head_dim, generator=g)
    v_buf = torch.randn(hk, rows, head_dim, generator=g)
    k_buf[:, 7] *= 40
    k_buf[:, 100:200] = k_buf[:, 100:101]
    lens = torch.tensor([1, 100, 2000])
    slots = torch.zeros(3, 2000, dtype=torch.int64)
    slots[0, 0] = 7
    slots[1, :100] = torch.arange(100, 200)
    slots[2, :] = torch.randperm(rows, generator=g)[:2000]
    slots[2, 1234] = 7  # the sharp key inside one split of the long sequence
    q = (torch.randn(3, hq, head_dim, generator=g) * 4).to(dtype)
    k_buf, v_buf = k_buf.to(dtype), v_buf.to(dtype)
    out = ops.decode_attention(q, k_buf, v_buf, slots, lens, head_dim**-0.5)
    _close(out, ref.decode_attention(q, k_buf, v_buf, slots, lens, head_dim**-0.5), dtype)


def test_builds_without_amx_refuse_prefill_attention(ops):
    """Only the avx512bf16 build carries the AMX kernel; the others say so instead of crashing."""
    if ops.isa() == "avx512bf16":
        pytest.skip("the avx512bf16 build has the AMX kernel (tested above where the CPU has AMX)")
    assert not ops.prefill_attention_supported()
    q = torch.zeros(2, 1, 64).bfloat16()
    with pytest.raises(RuntimeError, match="AMX is not available"):
        ops.prefill_attention(q, q, q, 0.125)
