"""decode_attention over an FP8 KV pool (kernels/cpu/csrc/sglang_cpu_ops.cpp: float8_e4m3fn /
float8_e5m2 K / V widened inside the kernel, times the layer's k / v scales) and
prefill_attention_vec over an FP8 cached prefix, against a torch reference that widens the rows
first, on every build this CPU runs. The `cpu` attention backend over an FP8 pool:
test_cpu_fp8_backend.py."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.kernels.cpu import reference as ref

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
# float32 q: the same values (widening is exact), summation order and the folded scales differ;
# bfloat16 q: one rounding of the output
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def _widened_reference(q, k_buf, v_buf, slots, lens, scale, k_scale, v_scale):
    """Widen the whole pool (the copy the kernel avoids), scale it, attend in float32."""
    return ref.decode_attention(q, k_buf.float() * k_scale, v_buf.float() * v_scale, slots, lens, scale)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# 64 / 128: the fixed-width vector paths; 40: AVX2's any-multiple-of-8 path, AVX-512's portable
# one; 19: the portable path everywhere
@pytest.mark.parametrize("head_dim", [64, 128, 40, 19])
@pytest.mark.parametrize("heads", [(9, 3), (8, 1)])
def test_fp8_decode_matches_widened_reference(ops, fp8, dtype, head_dim, heads):
    """GQA, ragged lengths (1 included), scales != 1, scattered rows; with one KV head the
    1500-token request is split into several tasks on any thread count."""
    hq, hk = heads
    g = torch.Generator().manual_seed(head_dim + hq)
    rows = 3000
    # * 3: e4m3's subnormals (< 2^-6) and its coarse top are both used
    k_buf = (torch.randn(hk, rows, head_dim, generator=g) * 3).to(fp8)
    v_buf = (torch.randn(hk, rows, head_dim, generator=g) * 3).to(fp8)
    lens = torch.tensor([1, 37, 700, 5, 1500])
    slots = torch.zeros(len(lens), int(lens.max()), dtype=torch.int64)
    for i, n in enumerate(lens.tolist()):
        slots[i, :n] = torch.randperm(rows - 1, generator=g)[:n] + 1
    qkv = torch.randn(len(lens), (hq + 2 * hk) * head_dim, generator=g).to(dtype)
    q = qkv[:, : hq * head_dim].view(len(lens), hq, head_dim)  # strided rows, as the model passes q
    args = (q, k_buf, v_buf, slots, lens, head_dim**-0.5)
    for k_scale, v_scale in ((0.37, 1.9), (1.0, 1.0)):
        out = ops.decode_attention(*args, k_scale, v_scale)
        want = _widened_reference(*args, k_scale, v_scale)
        assert out.dtype == dtype and out.shape == want.shape
        torch.testing.assert_close(out.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    # the scales are applied: k's changes the weights, v's the output
    plain = ops.decode_attention(*args)
    assert float((plain.float() - out.float()).abs().max()) == 0.0
    assert float((ops.decode_attention(*args, 0.37, 1.9).float() - plain.float()).abs().max()) > 0.05


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("head_dim", [128, 24, 20])
def test_fp8_every_code_widens_exactly(ops, fp8, head_dim):
    """One key (its softmax weight is exactly 1), zero K, every V code in some row: the float32
    output is each code's value exactly (NaN codes stay NaN, e5m2's infinities stay infinite)."""
    codes = torch.arange(256, dtype=torch.uint8)
    n = -(-256 // head_dim)  # rows that hold every code
    v_codes = codes.repeat(n)[: n * head_dim].view(1, n, head_dim)
    v_buf = torch.cat([torch.zeros(1, 1, head_dim, dtype=torch.uint8), v_codes], dim=1).view(fp8)
    k_buf = torch.zeros_like(v_buf)
    slots = torch.arange(1, n + 1, dtype=torch.int64).view(n, 1)
    q = torch.randn(n, 2, head_dim)
    out = ops.decode_attention(q, k_buf, v_buf, slots, torch.ones(n, dtype=torch.int64), 0.125)
    want = v_buf[0, 1:].float()[:, None, :].expand(n, 2, head_dim)
    torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)
    # bf16 q, `bf16_dot` (head dim 128: the avx512bf16 build widens the codes to bf16 for vdpbf16ps):
    # every code is a bf16, so the bf16 output is each code's value too
    dot = ops.decode_attention(
        q.bfloat16(), k_buf, v_buf, slots, torch.ones(n, dtype=torch.int64), 0.125, bf16_dot=True
    )
    torch.testing.assert_close(dot.float(), want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(9, 3), (8, 1)])
def test_fp8_pool_equals_bf16_pool_of_its_values(ops, fp8, head_dim, heads):
    """bf16 q over an FP8 pool and over a bf16 pool holding the same values (every FP8 value is a
    bf16; e4m3's 2^-8 factor is a power of two), unit scales: the same bits with and without
    `bf16_dot` on the avx512bf16 build (the dot path widens an FP8 task's rows to bf16 first; the
    flag changes the result there), and close elsewhere (AVX2 reads bf16 rows on its own path).
    With scales, the dot path stays within bf16 of the widened reference. (8, 1): a 1500-key
    request split over tasks and merged."""
    hq, hk = heads
    g = torch.Generator().manual_seed(7 * head_dim + hq)
    rows = 3000
    k_buf = (torch.randn(hk, rows, head_dim, generator=g) * 3).to(fp8)
    v_buf = (torch.randn(hk, rows, head_dim, generator=g) * 3).to(fp8)
    kb, vb = k_buf.float().bfloat16(), v_buf.float().bfloat16()
    assert torch.equal(kb.float(), k_buf.float()) and torch.equal(vb.float(), v_buf.float())
    lens = torch.tensor([1, 37, 700, 5, 1500])
    slots = torch.zeros(len(lens), int(lens.max()), dtype=torch.int64)
    for i, n in enumerate(lens.tolist()):
        slots[i, :n] = torch.randperm(rows - 1, generator=g)[:n] + 1
    q = torch.randn(len(lens), hq, head_dim, generator=g).bfloat16()
    args = (slots, lens, head_dim**-0.5)
    out = {}
    for dot in (False, True):
        out[dot] = ops.decode_attention(q, k_buf, v_buf, *args, bf16_dot=dot)
        same = ops.decode_attention(q, kb, vb, *args, bf16_dot=dot)
        if ops.isa() == "avx512bf16":
            assert torch.equal(out[dot], same), dot
        else:
            torch.testing.assert_close(out[dot].float(), same.float(), atol=TOL[torch.bfloat16], rtol=0)
    if ops.isa() == "avx512bf16":
        assert not torch.equal(out[False], out[True])  # the dot path ran (p rounded to bf16)
    scaled = ops.decode_attention(q, k_buf, v_buf, *args, 0.37, 1.9, bf16_dot=True)
    want = _widened_reference(q, k_buf, v_buf, *args, 0.37, 1.9)
    torch.testing.assert_close(
        scaled.float(), want.float(), atol=TOL[torch.bfloat16], rtol=TOL[torch.bfloat16]
    )


def test_fp8_decode_rejects_mixed_pools(ops):
    q = torch.randn(2, 4, 8)
    kb = torch.randn(2, 10, 8)
    slots = torch.zeros(2, 3, dtype=torch.int64)
    lens = torch.tensor([1, 2])
    e4m3, e5m2 = kb.to(torch.float8_e4m3fn), kb.to(torch.float8_e5m2)
    for k, v in ((e4m3, e5m2), (e4m3, kb), (kb, e5m2)):
        with pytest.raises(RuntimeError, match="share a dtype"):
            ops.decode_attention(q, k, v, slots, lens, 1.0)
    assert ops.decode_attention(q, e5m2, e5m2, slots, lens, 1.0).dtype == torch.float32


# ---------------------------------------------------------------------------- prefill over an FP8 prefix
@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp8_prefix_prefill_vec_matches_widened_reference(ops, fp8, dtype, head_dim):
    """prefill_attention_vec: a chunk (fresh k / v in q's dtype) after a cached prefix read from
    scattered rows of an FP8 pool, widened in the kernel times k_scale / v_scale."""
    if not ops.prefill_attention_vec_supported():
        pytest.skip(f"the {ops.isa()} build has no vector prefill path")
    g = torch.Generator().manual_seed(head_dim)
    hq, hk, rows, prefix = 6, 2, 700, 300
    k_cache = (torch.randn(hk, rows, head_dim, generator=g) * 3).to(fp8)
    v_cache = (torch.randn(hk, rows, head_dim, generator=g) * 3).to(fp8)
    slots = torch.randperm(rows, generator=g)[:prefix]
    for n in (1, 37):
        q = torch.randn(n, hq, head_dim, generator=g).to(dtype)
        k = torch.randn(n, hk, head_dim, generator=g).to(dtype)
        v = torch.randn(n, hk, head_dim, generator=g).to(dtype)
        got = ops.prefill_attention_vec(q, k, v, 0.125, k_cache, v_cache, slots, k_scale=0.37, v_scale=1.9)
        want = ref.prefill_attention(q, k, v, 0.125, k_cache.float() * 0.37, v_cache.float() * 1.9, slots)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    with pytest.raises(RuntimeError, match="float8_e4m3fn / float8_e5m2"):
        ops.prefill_attention_vec(q, k, v, 0.125, k_cache, v_cache.float().to(dtype), slots)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp8_prefix_prefill_bf16_dot(ops, fp8, head_dim):
    """prefill_attention_vec's `bf16_dot` over an FP8 prefix (the avx512bf16 build; elsewhere the
    flag is ignored): its rows widened times the scales and rounded to bf16, so at unit scales the
    same bits as over a bf16 cache holding the FP8 values (and not the float32 path's); with
    scales, within bf16 of the widened reference."""
    if not ops.prefill_attention_vec_supported():
        pytest.skip(f"the {ops.isa()} build has no vector prefill path")
    g = torch.Generator().manual_seed(5 * head_dim)
    hq, hk, rows, prefix = 6, 2, 700, 300
    k_cache = (torch.randn(hk, rows, head_dim, generator=g) * 3).to(fp8)
    v_cache = (torch.randn(hk, rows, head_dim, generator=g) * 3).to(fp8)
    kb, vb = k_cache.float().bfloat16(), v_cache.float().bfloat16()
    slots = torch.randperm(rows, generator=g)[:prefix]
    dot = ops.isa() == "avx512bf16"
    for n in (1, 37, 100):
        q, k, v = (torch.randn(n, h, head_dim, generator=g).bfloat16() for h in (hq, hk, hk))
        got = ops.prefill_attention_vec(q, k, v, 0.125, k_cache, v_cache, slots, bf16_dot=True)
        same = ops.prefill_attention_vec(q, k, v, 0.125, kb, vb, slots, bf16_dot=True)
        if dot:
            assert torch.equal(got, same), n
            assert not torch.equal(got, ops.prefill_attention_vec(q, k, v, 0.125, k_cache, v_cache, slots)), n
        else:
            torch.testing.assert_close(got.float(), same.float(), atol=TOL[torch.bfloat16], rtol=0)
        got = ops.prefill_attention_vec(
            q, k, v, 0.125, k_cache, v_cache, slots, k_scale=0.37, v_scale=1.9, bf16_dot=True
        )
        want = ref.prefill_attention(q, k, v, 0.125, k_cache.float() * 0.37, v_cache.float() * 1.9, slots)
        # the prefix's V values have a std of ~6 (3 * 1.9): bf16's relative error, in those units
        torch.testing.assert_close(
            got.float(), want.float(), atol=6 * TOL[torch.bfloat16], rtol=TOL[torch.bfloat16]
        )
