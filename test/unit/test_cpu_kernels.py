"""The fused CPU kernels (kernels/cpu) against their torch references, and the layers that use
them against their torch paths.

Every test that takes `ops` runs once per instruction-set build this CPU can execute
(kernels/cpu/isa.py: avx512bf16, avx512, avx2, portable), so an AVX-512 / AMX machine also checks
the code that AVX-512 CPUs without BF16, AVX2-only and older CPUs run. A build that is missing fails the test where a C++ compiler exists
(`make setup` builds them all); without a compiler it skips."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest
import torch
from sglang.srt.kernels.cpu import isa, loader
from sglang.srt.kernels.cpu import reference as ref
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.rotary import RotaryEmbedding
from sglang.srt.platforms import fresh_platforms
from sglang.srt.platforms import kernel_dispatch as dispatch

RUNNABLE = [v.name for v in isa.runnable_variants()]


def _compiler() -> bool:
    return shutil.which(os.environ.get("CXX", "c++")) is not None


@pytest.fixture(scope="module", params=RUNNABLE)
def ops(request):
    result = loader.load_variant(request.param)
    if result.module is None:
        if _compiler():
            pytest.fail(f"CPU kernels: {result.reason}")
        pytest.skip(f"no C++ compiler here, so no CPU kernels ({result.reason})")
    assert result.module.isa() == request.param
    return result.module


@contextlib.contextmanager
def _kernels_off(monkeypatch):
    """SGLANG_CPU_KERNELS=0 for the block (fresh platform objects: their kernel tables ask again)."""
    monkeypatch.setenv("SGLANG_CPU_KERNELS", "0")
    try:
        with fresh_platforms():
            yield
    finally:
        monkeypatch.delenv("SGLANG_CPU_KERNELS")


# float32: the same math up to summation order; bfloat16: one rounding of the output (plus the
# rounded inputs the reference sees as well)
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    assert a.dtype == b.dtype == dtype and a.shape == b.shape
    torch.testing.assert_close(a.float(), b.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# 64 / 128: the fixed-width vector paths; 24: AVX2's any-multiple-of-8 path, AVX-512's portable
# one; 20: the portable path everywhere
@pytest.mark.parametrize("head_dim", [64, 128, 24, 20])
@pytest.mark.parametrize("heads", [(4, 4), (9, 3), (8, 1)])
def test_decode_attention_matches_reference(ops, dtype, head_dim, heads):
    hq, hk = heads
    g = torch.Generator().manual_seed(head_dim + hq)
    rows = 3000
    k_buf = torch.randn(hk, rows, head_dim, generator=g).to(dtype)
    v_buf = torch.randn(hk, rows, head_dim, generator=g).to(dtype)
    lens = torch.tensor([1, 37, 700, 5, 1500])  # ragged; the long ones are split across tasks
    slots = torch.zeros(len(lens), int(lens.max()), dtype=torch.int64)
    for i, n in enumerate(lens.tolist()):
        slots[i, :n] = torch.randperm(rows - 1, generator=g)[:n] + 1  # scattered pool rows
    # q as a strided view (rows of a wider qkv projection), like the model passes it
    qkv = torch.randn(len(lens), (hq + 2 * hk) * head_dim, generator=g).to(dtype)
    q = qkv[:, : hq * head_dim].view(len(lens), hq, head_dim)
    assert not q.is_contiguous()
    out = ops.decode_attention(q, k_buf, v_buf, slots, lens, head_dim**-0.5)
    want = ref.decode_attention(q, k_buf, v_buf, slots, lens, head_dim**-0.5)
    _close(out, want, dtype)
    # bf16_dot (a bf16 pool's scores by vdpbf16ps on q's own bits where the build has it; a hint
    # the other builds and dtypes ignore): the same reference, the same tolerance
    _close(ops.decode_attention(q, k_buf, v_buf, slots, lens, head_dim**-0.5, bf16_dot=True), want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dims", [(64, 32), (40, 64), (24, 12)])
def test_decode_attention_value_dim_differs(ops, dtype, dims):
    """V rows narrower / wider than K rows (the output has V's head dim); lengths around the
    8-key blocks of the AVX2 path."""
    d, dv = dims
    g = torch.Generator().manual_seed(d + dv)
    rows, hq, hk = 400, 6, 2
    k_buf = torch.randn(hk, rows, d, generator=g).to(dtype)
    v_buf = torch.randn(hk, rows, dv, generator=g).to(dtype)
    lens = torch.tensor([1, 7, 8, 9, 15, 16, 17, 300])
    slots = torch.stack([torch.randperm(rows, generator=g)[:300] for _ in lens])
    q = torch.randn(len(lens), hq, d, generator=g).to(dtype)
    out = ops.decode_attention(q, k_buf, v_buf, slots, lens, d**-0.5)
    assert out.shape == (len(lens), hq, dv)
    _close(out, ref.decode_attention(q, k_buf, v_buf, slots, lens, d**-0.5), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 7, 8, 9, 23, 581])  # below, at and past the 8 / 16-lane bodies
def test_norm_silu_rope_odd_widths(ops, dtype, width):
    """Row widths that leave vector tails (every build: 8-lane AVX2 bodies, 16-lane AVX-512 ones,
    scalar tails), a strided x, and RoPE with rotary halves that are not multiples of 8."""
    g = torch.Generator().manual_seed(width)
    rows = 5
    wide = torch.randn(rows, width + 3, generator=g).to(dtype)
    x = wide[:, :width]  # strided rows
    r = torch.randn(rows, width, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(width, generator=g)).to(dtype)
    _close(ops.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5), dtype)
    out, res = ops.add_rms_norm(x, r, w, 1e-5)
    ref_out, ref_res = ref.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(res, ref_res)  # the residual add rounds exactly like torch's
    _close(out, ref_out, dtype)
    gu = torch.randn(rows, 2 * width, generator=g).to(dtype) * 4
    _close(ops.silu_and_mul(gu), ref.silu_and_mul(gu), dtype)
    head = 2 * width + 6
    for rot in sorted({2, 2 * width, 2 * (width // 2) + 2}):  # halves of 1, width and about width / 2
        x3 = torch.randn(rows, 3, head, generator=g).to(dtype)[:, :2]  # strided heads
        cos = torch.randn(rows, rot, generator=g).to(dtype)
        sin = torch.randn(rows, rot, generator=g).to(dtype)
        _close(ops.rope(x3, cos, sin, rot), ref.rope(x3, cos, sin, rot), dtype)


@pytest.mark.parametrize("rows,width", [(1, 576), (5, 19), (33, 64)])
def test_add_rms_norm_float32_residual_under_bf16(ops, rows, width):
    """A bf16 model's float32 residual stream: bf16 x + float32 residual -> a float32 residual
    (unrounded: exactly torch's promoted add) and bf16 normed rows of that float32 sum; widths with
    vector tails and strided rows."""
    g = torch.Generator().manual_seed(rows * width)
    x = torch.randn(rows, width + 5, generator=g).bfloat16()[:, :width]
    r = torch.randn(rows, width, generator=g) * 7
    w = (1 + 0.1 * torch.randn(width, generator=g)).bfloat16()
    out, res = ops.add_rms_norm(x, r, w, 1e-5)
    ref_out, ref_res = ref.add_rms_norm(x, r, w, 1e-5)
    assert res.dtype == torch.float32 and out.dtype == torch.bfloat16
    assert torch.equal(res, x.float() + r)  # kept unrounded
    assert not torch.equal(res, res.bfloat16().float())  # (a bf16-rounded stream would be caught)
    _close(out, ref_out, torch.bfloat16)
    with pytest.raises(RuntimeError, match="residual must match"):
        ops.add_rms_norm(x.float(), r.bfloat16(), w.float(), 1e-5)  # a bf16 residual under float32 x


def test_decode_attention_rejects_bad_input(ops):
    q = torch.randn(2, 4, 8)
    kb = torch.randn(2, 10, 8)
    slots = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="lens"):
        ops.decode_attention(q, kb, kb, slots, torch.tensor([1, 4]), 1.0)  # 4 > max_len
    with pytest.raises(RuntimeError, match="share a dtype"):
        ops.decode_attention(q, kb.bfloat16(), kb.bfloat16(), slots, torch.tensor([1, 2]), 1.0)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ops.decode_attention(q.half(), kb.half(), kb.half(), slots, torch.tensor([1, 2]), 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 16, 3000])  # one thread / split over threads
def test_norm_silu_rope_match_reference(ops, dtype, rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 576, generator=g).to(dtype)
    r = torch.randn(rows, 576, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(576, generator=g)).to(dtype)
    _close(ops.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5), dtype)
    out, res = ops.add_rms_norm(x, r, w, 1e-5)
    ref_out, ref_res = ref.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(res, ref_res)  # the residual add rounds exactly like torch's
    _close(out, ref_out, dtype)
    gu = torch.randn(rows, 2 * 1536, generator=g).to(dtype) * 4
    _close(ops.silu_and_mul(gu), ref.silu_and_mul(gu), dtype)
    for rot in (64, 32):  # full and partial rotary
        qkv = torch.randn(rows, 15 * 64, generator=g).to(dtype)
        x3 = qkv[:, : 12 * 64].view(rows, 12, 64)  # strided rows
        cos = torch.randn(rows, rot, generator=g).to(dtype)
        sin = torch.randn(rows, rot, generator=g).to(dtype)
        _close(ops.rope(x3, cos, sin, rot), ref.rope(x3, cos, sin, rot), dtype)


def test_exp_extremes_stay_finite(ops):
    """silu of large negative / positive gates (the kernel's exp clamps instead of overflowing)."""
    gate = torch.tensor([[-200.0, -90.0, -10.0, 0.0, 10.0, 90.0, 200.0]])
    x = torch.cat((gate, torch.ones_like(gate)), dim=1)
    out = ops.silu_and_mul(x)
    assert torch.isfinite(out).all()
    _close(out, ref.silu_and_mul(x), torch.float32)


def test_silu_bf16_extremes_match_torch(ops):
    """silu_and_mul in bf16 on huge, infinite and NaN gates (the AVX-512 vector path where the CPU
    has it, with a scalar tail: 19 = 16 + 3; the scalar path elsewhere): finite where torch is
    finite, inf / NaN where torch is."""
    gate = torch.tensor(
        [
            [-1e30, -200.0, -90.0, -10.0, -0.5, 0.0, 0.5, 10.0, 90.0, 200.0, 3e38]
            + [float("inf"), float("-inf"), float("nan")]
            + [1.5] * 5
        ]
    ).bfloat16()
    up = torch.linspace(-2, 2, gate.shape[1]).view(1, -1).bfloat16()
    got, want = ops.silu_and_mul(torch.cat((gate, up), dim=1)), ref.silu_and_mul(torch.cat((gate, up), dim=1))
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    fin = want.isfinite()
    torch.testing.assert_close(got[fin].float(), want[fin].float(), atol=1e-30, rtol=TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layers_fused_equal_torch_paths(ops, monkeypatch, dtype):
    """RMSNorm (with and without residual), SiluAndMul and RotaryEmbedding give the same results
    through the kernels as through their torch code (SGLANG_CPU_KERNELS=0)."""
    g = torch.Generator().manual_seed(7)
    norm = RMSNorm(64, eps=1e-6, params_dtype=dtype)
    norm.weight.data.copy_(1 + 0.1 * torch.randn(64, generator=g))
    rope = RotaryEmbedding(32, 256, base=10000.0, dtype=dtype)
    act = SiluAndMul()
    x = torch.randn(11, 64, generator=g).to(dtype)
    res = torch.randn(11, 64, generator=g).to(dtype)
    gu = torch.randn(11, 128, generator=g).to(dtype)
    pos = torch.randint(0, 256, (11,), generator=g)
    qk = torch.randn(11, 2 * 32, generator=g).to(dtype).view(11, 2, 32)

    def run():
        cos, sin = rope.cos_sin(pos)
        return [norm(x), *norm(x, res), act(gu), rope.apply(qk, cos, sin)]

    monkeypatch.setenv("SGLANG_CPU_ISA", ops.isa())  # the layers' kernels: the build under test
    with fresh_platforms():
        assert dispatch.kernels_for_device(torch.device("cpu")) is ops
        fused = run()
    monkeypatch.delenv("SGLANG_CPU_ISA")
    with _kernels_off(monkeypatch):
        assert dispatch.kernels_for_device(torch.device("cpu")) is None
        plain = run()
    for a, b in zip(fused, plain):
        _close(a, b, dtype)


def test_bfloat16_rounding_and_nan_match_torch(ops):
    """The kernels' float32 -> bfloat16 rounding is torch's (nearest even), NaN stays NaN."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 32, generator=g) * 1000).bfloat16()
    r = torch.randn(64, 32, generator=g).bfloat16()
    _, res = ops.add_rms_norm(x, r, torch.ones(32, dtype=torch.bfloat16), 1e-6)
    assert torch.equal(res, x + r)
    x[3, 5] = float("nan")
    out, res = ops.add_rms_norm(x, r, torch.ones(32, dtype=torch.bfloat16), 1e-6)
    assert torch.isnan(res[3, 5]) and torch.isnan(out[3]).all() and not torch.isnan(out[4]).any()


def test_dispatch_table_answers_per_device_and_dtype(monkeypatch):
    """Device choices live in platforms/kernel_dispatch.py: CPU float tensors get the CPU paths, other
    devices / dtypes the portable ones (a meta tensor stands in for an accelerator here)."""
    cpu32, meta = torch.zeros(2, 3), torch.zeros(2, 3, device="meta")
    assert dispatch.flash_lse_op(cpu32) is not None and dispatch.flash_lse_op(meta) is None
    assert dispatch.flash_lse_op(cpu32.half()) is None
    assert dispatch.splits_attention(torch.device("cpu")) and not dispatch.splits_attention(meta.device)
    assert dispatch.host_argmax(cpu32) and not dispatch.host_argmax(cpu32.bfloat16())
    assert not dispatch.host_argmax(meta) and not dispatch.host_argmax(torch.zeros(0, 3))
    assert dispatch.fused_ops(meta) is None and dispatch.fused_ops(cpu32.half()) is None
    with _kernels_off(monkeypatch):
        assert dispatch.fused_ops(cpu32) is None


@pytest.mark.parametrize("heads", [(9, 3), (4, 4), (8, 1)])
def test_prefill_attention_matches_reference(ops, heads):
    """The AMX prefill kernel (where the CPU has AMX): ragged lengths around its 16-row / 64-key
    blocks, GQA, strided q / k / v views of one qkv projection, bf16 against float32 math."""
    if not ops.prefill_attention_supported():
        pytest.skip(f"no AMX in this CPU or in the {ops.isa()} build")
    hq, hk = heads
    g = torch.Generator().manual_seed(hq)
    # n around the 16-row tasks and 64-key blocks; 300 also with scores 8x sharper (most p underflow
    # to 0 or far below bf16's range, and the running max jumps by large steps)
    for n, sharp in (
        (1, 1),
        (15, 1),
        (16, 1),
        (17, 1),
        (31, 1),
        (33, 1),
        (63, 1),
        (64, 1),
        (65, 1),
        (300, 1),
        (300, 8),
        (1100, 1),
    ):
        qkv = torch.randn(n, (hq + 2 * hk) * 64, generator=g).bfloat16()
        q = qkv[:, : hq * 64].view(n, hq, 64) * sharp
        k = qkv[:, hq * 64 : (hq + hk) * 64].view(n, hk, 64)
        v = qkv[:, (hq + hk) * 64 :].view(n, hk, 64)
        _close(ops.prefill_attention(q, k, v, 0.125), ref.prefill_attention(q, k, v, 0.125), torch.bfloat16)
    with pytest.raises(RuntimeError, match="bfloat16"):
        ops.prefill_attention(q.float(), k.float(), v.float(), 0.125)


def test_prefill_attention_rising_scores(ops):
    """Scores that grow along the keys (later keys far above every earlier running max): the
    kernel's lazy max must notice the overflowing block sums, rescale and redo those blocks."""
    if not ops.prefill_attention_supported():
        pytest.skip(f"no AMX in this CPU or in the {ops.isa()} build")
    g = torch.Generator().manual_seed(7)
    n, hq, hk = 700, 4, 2
    q = torch.randn(n, hq, 64, generator=g).abs().bfloat16()
    ramp = torch.linspace(0.05, 40.0, n).view(n, 1, 1)  # late scores > 2^128 x early ones in p
    k = (torch.randn(n, hk, 64, generator=g).abs() * ramp).bfloat16()
    v = torch.randn(n, hk, 64, generator=g).bfloat16()
    _close(ops.prefill_attention(q, k, v, 0.125), ref.prefill_attention(q, k, v, 0.125), torch.bfloat16)


@pytest.mark.parametrize("prefix", [1, 40, 64, 200])
def test_prefill_attention_over_cached_prefix(ops, prefix):
    """A chunk over a cached prefix (chunked prefill / prefix-cache hit): prefix keys read from
    scattered rows of head-major caches, then the chunk's own keys causally."""
    if not ops.prefill_attention_supported():
        pytest.skip(f"no AMX in this CPU or in the {ops.isa()} build")
    g = torch.Generator().manual_seed(prefix)
    hq, hk, rows = 9, 3, 1000
    k_cache = torch.randn(hk, rows, 64, generator=g).bfloat16()
    v_cache = torch.randn(hk, rows, 64, generator=g).bfloat16()
    slots = torch.randperm(rows, generator=g)[:prefix]
    for n in (1, 17, 130):
        qkv = torch.randn(n, (hq + 2 * hk) * 64, generator=g).bfloat16()
        q = qkv[:, : hq * 64].view(n, hq, 64)
        k = qkv[:, hq * 64 : (hq + hk) * 64].view(n, hk, 64)
        v = qkv[:, (hq + hk) * 64 :].view(n, hk, 64)
        got = ops.prefill_attention(q, k, v, 0.125, k_cache, v_cache, slots)
        _close(got, ref.prefill_attention(q, k, v, 0.125, k_cache, v_cache, slots), torch.bfloat16)
        # written in place into rows of a larger output (a batch's [tokens, heads, 64])
        batch_out = torch.full((n + 5, hq, 64), 7.0).bfloat16()
        assert (
            ops.prefill_attention(q, k, v, 0.125, k_cache, v_cache, slots, out=batch_out[3 : 3 + n])
            is not None
        )
        assert (
            torch.equal(batch_out[3 : 3 + n], got)
            and (batch_out[:3] == 7).all()
            and (batch_out[3 + n :] == 7).all()
        )
    with pytest.raises(RuntimeError, match="outside the cache"):
        ops.prefill_attention(q, k, v, 0.125, k_cache, v_cache, torch.tensor([rows]))
    with pytest.raises(RuntimeError, match="out must be"):
        ops.prefill_attention(q, k, v, 0.125, out=torch.empty(n, hq, 64))  # float32


# ---------------------------------------------------------------------------- choosing a build
def test_every_build_is_the_one_it_claims(ops):
    """Each module reports its variant and the sources it was built from (the current ones)."""
    assert ops.isa() in RUNNABLE and ops.source_tag() == isa.source_tag()
