"""The float32 vector prefill attention kernel (kernels/cpu/csrc/prefill_attention_vec.cpp: AVX-512
and AVX2 paths) against the torch reference, once per instruction-set build this CPU executes,
and the `cpu` attention backend's choice between it, the AMX kernel and SDPA."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang.srt.kernels.cpu import reference as ref
from sglang.srt.layers.attention import cpu_backend

# float32: the same math as SDPA up to the order of the sums (2^x to ~1e-7); bfloat16: one rounding
# of the output
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


@pytest.fixture
def vec(ops):
    if not ops.prefill_attention_vec_supported():
        pytest.skip(f"the {ops.isa()} build has no vector prefill path")
    return ops


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(a.float(), b.float(), atol=TOL[a.dtype], rtol=TOL[a.dtype])


def _qkv(n: int, hq: int, hk: int, d: int, dtype: torch.dtype, g: torch.Generator):
    """Strided q / k / v views of one fused projection's output, as the model hands them over."""
    qkv = torch.randn(n, (hq + 2 * hk) * d, generator=g).to(dtype)
    return (
        qkv[:, : hq * d].view(n, hq, d),
        qkv[:, hq * d : (hq + hk) * d].view(n, hk, d),
        qkv[:, (hq + hk) * d :].view(n, hk, d),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(9, 3), (4, 4), (8, 1)])
def test_matches_reference(vec, dtype, head_dim, heads):
    """Lengths around the tasks' 16 / 48 rows and the 48 / 64-key blocks of the two paths, GQA,
    and scores 8x sharper (most p underflow, the running max jumps by large steps)."""
    hq, hk = heads
    g = torch.Generator().manual_seed(hq * head_dim)
    scale = head_dim**-0.5
    for n, sharp in (
        (1, 1),
        (15, 1),
        (16, 1),
        (17, 1),
        (47, 1),
        (48, 1),
        (49, 1),
        (64, 1),
        (65, 1),
        (97, 1),
        (300, 8),
    ):
        q, k, v = _qkv(n, hq, hk, head_dim, dtype, g)
        q = q * sharp
        _close(vec.prefill_attention_vec(q, k, v, scale), ref.prefill_attention(q, k, v, scale))


def test_long_sequence_and_rising_scores(vec):
    """1,100 tokens (many key blocks per task), and keys whose scores grow along the sequence (each
    block's max far above the running max: every block rescales the output so far)."""
    g = torch.Generator().manual_seed(11)
    q, k, v = _qkv(1100, 6, 2, 64, torch.float32, g)
    _close(vec.prefill_attention_vec(q, k, v, 0.125), ref.prefill_attention(q, k, v, 0.125))
    n = 700
    q = torch.randn(n, 4, 64, generator=g).abs()
    ramp = torch.linspace(0.05, 40.0, n).view(n, 1, 1)
    k = torch.randn(n, 2, 64, generator=g).abs() * ramp
    v = torch.randn(n, 2, 64, generator=g)
    # scores reach ~300 here: float32 rounds them to ~2e-5, which 2^(s - max) turns into relative
    # errors of ~1e-4 in p in any float32 kernel (SDPA's too), hence the wider tolerance
    got, want = vec.prefill_attention_vec(q, k, v, 0.125), ref.prefill_attention(q, k, v, 0.125)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    _close(
        vec.prefill_attention_vec(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.125),
        ref.prefill_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.125),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prefix", [1, 64, 200])
def test_over_cached_prefix(vec, dtype, prefix):
    """A chunk after a cached prefix read from scattered rows of head-major pool buffers, written in
    place into rows of a larger output."""
    g = torch.Generator().manual_seed(prefix)
    hq, hk, rows = 9, 3, 1000
    k_cache = torch.randn(hk, rows, 64, generator=g).to(dtype)
    v_cache = torch.randn(hk, rows, 64, generator=g).to(dtype)
    slots = torch.randperm(rows, generator=g)[:prefix]
    for n in (1, 17, 130):
        q, k, v = _qkv(n, hq, hk, 64, dtype, g)
        got = vec.prefill_attention_vec(q, k, v, 0.125, k_cache, v_cache, slots)
        _close(got, ref.prefill_attention(q, k, v, 0.125, k_cache, v_cache, slots))
        batch_out = torch.full((n + 5, hq, 64), 7.0).to(dtype)
        vec.prefill_attention_vec(q, k, v, 0.125, k_cache, v_cache, slots, out=batch_out[3 : 3 + n])
        assert torch.equal(batch_out[3 : 3 + n], got)
        assert (batch_out[:3] == 7).all() and (batch_out[3 + n :] == 7).all()


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(9, 3), (8, 1)])
def test_bf16_dot_scores_match_reference(vec, head_dim, heads):
    """`bf16_dot=True`: the scores of bf16 q / k by vdpbf16ps (avx512bf16 build; every other build
    ignores the flag), fresh and over a bf16 cached prefix, ragged lengths around the 48-row tasks and
    64-key blocks, scores 8x sharper, 1,100 tokens; float32 inputs ignore the flag."""
    hq, hk = heads
    g = torch.Generator().manual_seed(5 * head_dim + hq)
    scale = head_dim**-0.5
    for n, sharp in ((1, 1), (17, 1), (48, 1), (49, 1), (65, 1), (300, 8), (1100, 1)):
        q, k, v = _qkv(n, hq, hk, head_dim, torch.bfloat16, g)
        q = q * sharp
        _close(
            vec.prefill_attention_vec(q, k, v, scale, bf16_dot=True), ref.prefill_attention(q, k, v, scale)
        )
    rows, prefix = 500, 70
    k_cache = torch.randn(hk, rows, head_dim, generator=g).bfloat16()
    v_cache = torch.randn(hk, rows, head_dim, generator=g).bfloat16()
    slots = torch.randperm(rows, generator=g)[:prefix]
    for n in (1, 50, 130):
        q, k, v = _qkv(n, hq, hk, head_dim, torch.bfloat16, g)
        got = vec.prefill_attention_vec(q, k, v, scale, k_cache, v_cache, slots, bf16_dot=True)
        _close(got, ref.prefill_attention(q, k, v, scale, k_cache, v_cache, slots))
    q, k, v = _qkv(65, hq, hk, head_dim, torch.float32, g)
    _close(vec.prefill_attention_vec(q, k, v, scale, bf16_dot=True), ref.prefill_attention(q, k, v, scale))


def test_bad_inputs_are_refused(vec):
    q = torch.zeros(4, 2, 64)
    with pytest.raises(RuntimeError, match="head dim 64 or 128"):
        vec.prefill_attention_vec(torch.zeros(4, 2, 96), torch.zeros(4, 2, 96), torch.zeros(4, 2, 96), 0.1)
    with pytest.raises(RuntimeError, match="one dtype"):
        vec.prefill_attention_vec(q, q.bfloat16(), q, 0.1)
    with pytest.raises(RuntimeError, match="outside the cache"):
        cache = torch.zeros(2, 10, 64)
        vec.prefill_attention_vec(q, q, q, 0.1, cache, cache, torch.tensor([3, 10]))


def test_builds_without_vectors_refuse(ops):
    """The portable build (baseline x86-64) has no vector path and says so instead of crashing."""
    if ops.prefill_attention_vec_supported():
        assert ops.isa() in ("avx512bf16", "avx512", "avx2")
        return
    q = torch.zeros(2, 1, 64)
    with pytest.raises(RuntimeError, match="no AVX2 / AVX-512 path"):
        ops.prefill_attention_vec(q, q, q, 0.125)


def _vec(*args, **kwargs):
    return "vec"


def _md(amx: bool, vec: bool):
    kernels = SimpleNamespace(prefill_attention="amx", prefill_attention_vec=_vec)
    return SimpleNamespace(prefill_kernel=amx, prefill_vec=vec, kernels=kernels)


def test_backend_picks_the_kernel_for_the_compute_dtype():
    """AMX for bf16 head dim 64 where the CPU has it; the float32 vector kernel wherever attention
    computes in float32 (float32 models, bf16 ones without AMX) and the shapes fit; else SDPA."""
    bf64, f64, bf128 = (
        torch.zeros(3, 2, 64).bfloat16(),
        torch.zeros(3, 2, 64),
        torch.zeros(3, 2, 128).bfloat16(),
    )
    pick = cpu_backend._prefill_kernel
    assert pick(_md(True, True), torch.bfloat16, bf64, bf64, bf64) == "amx"
    assert pick(_md(True, True), torch.bfloat16, bf128, bf128, bf128) is None  # AMX CPU: torch's bf16 SDPA
    assert pick(_md(False, True), torch.float32, bf128, bf128, bf128) is _vec  # bf16 without AMX
    assert pick(_md(True, True), torch.float32, f64, f64, f64) is _vec
    assert pick(_md(False, False), torch.float32, f64, f64, f64) is None  # generic build
    # bf16 compute (AMD's AVX512-BF16): the vector kernel's bf16_dot path, bf16 tensors only
    dot = pick(_md(False, True), torch.bfloat16, bf128, bf128, bf128)
    assert dot.func is _vec and dot.keywords == {"bf16_dot": True}
    e4m3 = torch.zeros(2, 5, 128, dtype=torch.float8_e4m3fn)  # an FP8 prefix pool: widened to bf16
    dot = pick(_md(False, True), torch.bfloat16, bf128, bf128, bf128, e4m3, e4m3)
    assert dot.func is _vec and dot.keywords == {"bf16_dot": True}
    assert pick(_md(False, True), torch.bfloat16, f64, f64, f64) is None
    assert pick(_md(False, True), torch.float32, f64, f64, bf64) is None  # mixed dtypes
    odd = torch.zeros(3, 2, 96)
    assert pick(_md(False, True), torch.float32, odd, odd, odd) is None
    strided = torch.zeros(3, 64, 2).transpose(1, 2)  # a head's values not contiguous
    assert pick(_md(False, True), torch.float32, strided, f64, f64) is None
