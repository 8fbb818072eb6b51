"""bf16_linear (kernels/cpu/csrc/bf16_linear.cpp: bf16 linears at decode sizes, AMX-BF16 tiles or
vdpbf16ps) against its torch reference on every build this CPU runs, pack_bf16_kpairs' layout,
and the packed pair the CPU platform hands to the bf16 linears (layers/linear_bf16_packed.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.kernels.cpu import isa
from sglang.srt.kernels.cpu import reference as ref
from sglang.srt.layers.linear_bf16_packed import Bf16PackedLinear, pack_bf16_kpairs
from sglang.srt.platforms import fresh_platforms, get_platform

# (rows, N, K): tails of every tile (16-row AMX tiles taken two at a time, 4-row vector tiles; 16-column
# blocks taken two / four at a time; K padded to 32), decode and SmolLM2-like shapes
SHAPES = [
    (1, 1, 1),
    (1, 37, 64),
    (2, 5, 19),
    (3, 16, 2),
    (5, 129, 70),
    (16, 576, 576),
    (17, 17, 17),
    (33, 50, 100),
    (40, 96, 1536),
    (130, 40, 40),
    # K a multiple of 32: AMX reads whole 16-row groups of x in place, the rest from a padded copy
    (48, 33, 64),
    (77, 64, 96),
    (300, 50, 576),
]


def _paths(ops) -> list[bool]:
    impl = ops.bf16_linear_impl()
    if impl == "":
        pytest.skip(
            f"the {ops.isa()} build has no AVX-512 or AVX2: bf16_linear is refused there (tested below)"
        )
    return [True, False] if impl == "amx" else [False]


def test_pack_layout_round_trips():
    w = torch.randn(20, 35).bfloat16()
    packed = pack_bf16_kpairs(w)
    assert packed.dtype == torch.int32 and packed.shape == (2, 32, 16)  # K 35 -> 64: 32 pairs
    item = packed[1, 3, 2].item()  # block 1, pair 3, lane 2: column 18, k = 6 and 7
    assert item & 0xFFFF == w[18, 6].view(torch.int16).item() & 0xFFFF
    assert (item >> 16) & 0xFFFF == w[18, 7].view(torch.int16).item() & 0xFFFF
    assert packed[1, :, 4:].eq(0).all() and packed[0, 18:].eq(0).all()  # columns 20.., k 36.. padding
    x = torch.randn(3, 35).bfloat16()
    torch.testing.assert_close(ref.bf16_linear(x, packed, 20), F.linear(x.float(), w.float()).bfloat16())
    with pytest.raises(ValueError, match="2-D bf16"):
        pack_bf16_kpairs(w.float())


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_matches_reference(ops, shape, with_bias):
    M, N, K = shape
    g = torch.Generator().manual_seed(M * 1000 + N + K)
    x = torch.randn(M, K, generator=g).bfloat16()
    w = torch.randn(N, K, generator=g).bfloat16()
    bias = torch.randn(N, generator=g).bfloat16() if with_bias else None
    packed = pack_bf16_kpairs(w)
    want = ref.bf16_linear(x, packed, N, bias).float()
    for use_amx in _paths(ops):
        got = ops.bf16_linear(x, packed, N, bias, use_amx).float()
        # float32 sums in another order (|terms| < ~20: K * 2e-6 apart at most), rounded to bf16 once:
        # at most one bf16 step apart
        step = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(1e-3))) - 7)
        assert ((got - want).abs() <= step + K * 2e-6).all(), (use_amx, (got - want).abs().max())


def test_strided_rows_and_zero_rows(ops):
    paths = _paths(ops)
    w = torch.randn(48, 64).bfloat16()
    packed = pack_bf16_kpairs(w)
    for rows in (6, 37):  # all from the padded copy; two 16-row groups in place + the rest
        wide = torch.randn(rows, 100).bfloat16()
        x = wide[:, 10:74]  # rows 100 apart, contiguous within
        for use_amx in paths:
            torch.testing.assert_close(
                ops.bf16_linear(x, packed, 48, None, use_amx), ref.bf16_linear(x, packed, 48)
            )
            assert ops.bf16_linear(x[:0], packed, 48, None, use_amx).shape == (0, 48)


def test_bad_input_is_refused(ops):
    w = torch.randn(20, 40).bfloat16()
    packed = pack_bf16_kpairs(w)
    x = torch.randn(2, 40).bfloat16()
    if ops.bf16_linear_impl() == "":
        with pytest.raises(RuntimeError, match="has no AVX-512 / AVX2"):
            ops.bf16_linear(x, packed, 20)
        return
    with pytest.raises(RuntimeError, match="packed must be"):
        ops.bf16_linear(x, packed, 40)  # N says 3 blocks, packed holds 2
    with pytest.raises(RuntimeError, match="packed must be"):
        ops.bf16_linear(torch.randn(2, 70).bfloat16(), packed, 20)  # K 70 needs 48 pairs
    with pytest.raises(RuntimeError, match="x must be"):
        ops.bf16_linear(x.float(), packed, 20)
    with pytest.raises(RuntimeError, match="bias must be"):
        ops.bf16_linear(x, packed, 20, torch.randn(20))


def test_packed_pair_takes_the_kernel_up_to_max_rows(ops):
    _paths(ops)
    calls = []

    def entry(*args):
        calls.append(args[0].shape[0])
        return ops.bf16_linear(*args)

    pack, kernel = Bf16PackedLinear(entry, max_rows=8).pair()
    w, bias = torch.randn(30, 24).bfloat16(), torch.randn(30).bfloat16()
    packed = pack(w)
    for rows in (1, 8, 9, 40):
        x = torch.randn(rows, 24).bfloat16()
        want = F.linear(x.float(), w.float(), bias.float())
        torch.testing.assert_close(kernel(x, packed, bias).float(), want, atol=0.05, rtol=0.02)
    assert calls == [1, 8]  # 9 and 40 rows: plain F.linear
    calls.clear()
    pack, kernel = Bf16PackedLinear(entry, max_rows=8, narrow_k=24, narrow_max_rows=16).pair()
    wide = torch.randn(30, 40).bfloat16()
    for w_ in (w, wide):  # K 24 is narrow: up to 16 rows; K 40 is not: up to 8
        for rows in (8, 9, 16, 17):
            x = torch.randn(rows, w_.shape[1]).bfloat16()
            torch.testing.assert_close(
                kernel(x, pack(w_), None).float(), F.linear(x.float(), w_.float()), atol=0.05, rtol=0.02
            )
    assert calls == [8, 9, 16, 8]


def test_platform_picks_the_kernel_on_amx_and_amd(monkeypatch):
    """The CPU platform's packed bf16 linear is bf16_linear's pair where the kernel build runs AMX
    and the CPU kind (SGLANG_CPU_FLAGS_OVERRIDE included) has it, and its vdpbf16ps pair (every row
    count, no fused gate) on AMD's AVX512-BF16, its FMA path where the kind is AVX-512 without BF16
    or AVX2 (the avx512 / avx2 builds cap the kind); oneDNN's copy elsewhere (Intel's AVX512-BF16 without AMX, an
    emulated kind: no vendor)."""
    from sglang.srt.platforms import cpu as cpu_platform

    cpu = torch.device("cpu")
    seen = 0
    for variant in isa.runnable_variants():
        for kind, vendor in (
            (None, None),
            ("avx512-bf16", None),
            ("avx512-bf16", "AuthenticAMD"),
            ("avx512-bf16", "GenuineIntel"),
        ):
            monkeypatch.setenv("SGLANG_CPU_ISA", variant.name)
            if kind is None:
                monkeypatch.delenv("SGLANG_CPU_FLAGS_OVERRIDE", raising=False)
            else:
                monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", kind)
            with monkeypatch.context() as m, fresh_platforms():
                if vendor is not None:
                    m.setattr(cpu_platform, "effective_cpu_vendor", lambda v=vendor: v)
                real_vendor = cpu_platform.effective_cpu_vendor()
                platform = get_platform("cpu")
                ops = platform.kernels.fused()
                if ops is None or (kind is not None and variant.name != "avx512bf16"):
                    continue
                seen += 1
                amx = platform.kernels.amx_linears()
                assert (amx is not None) == (ops.bf16_linear_impl() == "amx" and kind is None), (
                    variant,
                    kind,
                )
                the_kind = cpu_platform.cpu_kind(cpu_platform.effective_cpu_flags())
                vec = amx is None and the_kind == "avx512-bf16" and real_vendor == "AuthenticAMD"
                vec = vec and ops.bf16_linear_impl() == "avx512-bf16"
                # the avx512 / avx2 builds on this CPU emulate AVX-512 without BF16 / AVX2: their
                # FMA paths (test_cpu_bf16_fma.py)
                fma = amx is None and ops.bf16_linear_impl() == f"{the_kind}-fma"
                pair = platform.prepacked_linear(torch.bfloat16, cpu)
                is_kernel = pair is not None and isinstance(pair[1], Bf16PackedLinear)
                assert is_kernel == (amx is not None or vec or fma), (variant, kind, vendor)
                if vec:  # the vdpbf16ps path at every row count, the gate fused as on AMX
                    pack, kernel = pair
                    w = torch.randn(64, 40).bfloat16()
                    for rows in (1, 9, 300):
                        x = torch.randn(rows, 40).bfloat16()
                        want = F.linear(x.float(), w.float())
                        torch.testing.assert_close(
                            kernel(x, pack(w), None).float(), want, atol=0.05, rtol=0.02
                        )
                    plain = ops.bf16_linear(x, pack(w)[0], 64, None, False)
                    assert torch.equal(kernel.swiglu(x, pack(w), None), ops.silu_and_mul(plain))
                assert platform.prepacked_linear(torch.float32, cpu) is None
    assert seen > 0


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_float32_out_kernel_matches_float32_product(ops, shape, with_bias):
    """bf16_linear_f32out (the LM head on AMX): float32 x split exactly into three bf16 planes, so the
    result is the float32 product up to the order of the sums; refused without AMX."""
    M, N, K = shape
    g = torch.Generator().manual_seed(M * 7 + N * 3 + K)
    x = torch.randn(M, K, generator=g) * 4
    w = torch.randn(N, K, generator=g).bfloat16()
    bias = torch.randn(N, generator=g) if with_bias else None
    packed = pack_bf16_kpairs(w)
    if ops.bf16_linear_impl() != "amx":
        with pytest.raises(RuntimeError, match="needs AMX"):
            ops.bf16_linear_f32out(x, packed, N, bias)
        return
    got = ops.bf16_linear_f32out(x, packed, N, bias)
    exact = x.double() @ w.double().T + (0 if bias is None else bias.double())
    assert got.dtype == torch.float32
    # float32 sums of K exact products: within K float32 steps of the largest partial sums
    scale = (x.double().abs() @ w.double().abs().T).max().item() + 1
    assert (got.double() - exact).abs().max().item() <= K * 2**-23 * scale
    torch.testing.assert_close(got, ref.bf16_linear_f32out(x, packed, N, bias), atol=K * 2e-6 * scale, rtol=0)
    # a bf16-rounded x would be off by ~2^-9 of the scale: this kernel keeps x's low bits
    rounded = x.bfloat16().double() @ w.double().T
    if K >= 32:
        assert (got.double() - exact).abs().max() < (rounded - x.double() @ w.double().T).abs().max() / 100


def test_float32_out_kernel_refuses_bad_input(ops):
    if ops.bf16_linear_impl() != "amx":
        pytest.skip("refused whole without AMX (above)")
    packed = pack_bf16_kpairs(torch.randn(20, 40).bfloat16())
    with pytest.raises(RuntimeError, match="x must be a float32"):
        ops.bf16_linear_f32out(torch.randn(2, 40).bfloat16(), packed, 20)
    with pytest.raises(RuntimeError, match="packed must be"):
        ops.bf16_linear_f32out(torch.randn(2, 40), packed, 33)
    with pytest.raises(RuntimeError, match="bias must be"):
        ops.bf16_linear_f32out(torch.randn(2, 40), packed, 20, torch.randn(20).bfloat16())


def test_lm_head_packing_follows_the_platform():
    """float32_logits_packing: the AMX kernel's k-pair copy where the platform runs AMX linears,
    the vector-lane copy of linear_f32out_packed elsewhere; either gives the float32 product."""
    from sglang.srt.layers import linear_float32_out as l32
    from sglang.srt.platforms.kernel_dispatch import amx_linear_kernels, fused_ops

    w = torch.randn(70, 96).bfloat16()
    packed = l32.float32_logits_packing(w)
    amx = amx_linear_kernels(w.device)
    if amx is not None:
        assert packed.run == amx.bf16_linear_f32out and packed.tensor.shape == (5, 48, 16)
    elif fused_ops(w) is not None:
        assert packed.run == fused_ops(w).linear_f32out_packed
    else:
        assert packed is None
    if packed is not None:
        assert packed.nbytes == packed.tensor.numel() * 4
        x = torch.randn(3, 96)
        got = l32.float32_out_linear(x, w, None, packed)
        torch.testing.assert_close(got, x @ w.float().T, atol=1e-4, rtol=1e-5)
