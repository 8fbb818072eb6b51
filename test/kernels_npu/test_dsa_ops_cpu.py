"""sgl_kernel_npu DSA ops: the torch reference against exact math, and the fused CPU kernels against
the reference on every instruction set this CPU can run (AVX-512 + BF16, AVX-512 + VNNI, AVX-512, AVX2 + VNNI, AVX2, portable:
the lower builds are forced on a machine that has the higher ones), float32 and bfloat16, and the
indexer's bf16 scoring (`score_dtype=torch.bfloat16`: vdpbf16ps on the avx512bf16 build, rounded
inputs multiplied in float32 on the others) against the reference on the same bf16-rounded inputs.

Cases: ragged batches (prefill chunks over a cached prefix, decodes), paged keys with shuffled
blocks, top-k >= the visible keys, causal edges (a request whose queries outnumber its keys), a
request with no keys. Indexer selections are compared as sets: exactly with small-integer inputs
(every score exact in float32, so ties are real and must go to the earlier position), and within
float tolerance of the exact k-th best score with random inputs.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import sgl_kernel_npu as skn
from dsa_cases import (
    check_near_topk,
    check_same_selection,
    check_same_set_but_near_ties,
    check_values,
    full_scores,
    indexer_case,
    paged,
    sfa_case,
    visible_counts,
)
from sgl_kernel_npu import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="sgl_kernel_npu built without its CPU kernels")

ISAS = cpu.supported_isas() if cpu.available() else []
RAGGED = dict(q_lens=[5, 1, 37, 1, 3], kv_lens=[40, 9, 37, 130, 2])


# every build the CPU runs; on the avx512bf16 build also with vdpbf16ps for the bf16 index scores
VARIANTS = ISAS + (["avx512bf16+dpbf16"] if "avx512bf16" in ISAS else [])


@pytest.fixture(params=VARIANTS)
def isa(request):
    name, _, dot = request.param.partition("+")
    with cpu.force_isa(name), cpu.bf16_dot(dot or "fma"):
        assert cpu.active_isa() == name
        yield request.param


def test_reference_indexer_matches_exact_scores():
    case = indexer_case(**RAGGED, topk=16)
    idx, val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="reference"
    )
    assert idx.shape == (sum(case.q_lens), 1, 16) and idx.dtype == torch.int32
    check_near_topk(idx[:, 0], full_scores(case), tol=1e-5)
    vis = visible_counts(case)
    for t, v in enumerate(vis):  # values are the picks' scores, sorted descending, -inf padded
        row = val[t, 0]
        assert torch.all(row[: min(v, 16)][:-1] >= row[: min(v, 16)][1:])
        assert torch.isinf(row[min(v, 16) :]).all()


@pytest.mark.parametrize("topk", [4, 16, 200])  # 200 >= every request's keys
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_cpu_indexer_exact_ties(isa, topk, block_size):
    case = indexer_case(**RAGGED, topk=topk, block_size=block_size, integer=True, seed=topk + block_size)
    ref_idx, ref_val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="reference"
    )
    got, got_val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="cpu"
    )
    check_same_selection(got[:, 0], ref_idx[:, 0], ref_val[:, 0], visible_counts(case))
    # the values belong to the picks: same multiset as the reference's
    assert torch.equal(got_val[:, 0].sort(dim=-1).values, ref_val[:, 0].sort(dim=-1).values)
    # without values, rows that see <= topk keys are answered without scoring: all their keys
    plain = skn.lightning_indexer(case.query, case.key, case.weights, **case.kwargs(), impl="cpu")
    check_same_selection(plain[:, 0], ref_idx[:, 0], ref_val[:, 0], visible_counts(case))


def test_cpu_indexer_random_long(isa):
    case = indexer_case(
        q_lens=[70, 1, 1], kv_lens=[600, 300, 1000], heads=16, dim=64, topk=64, block_size=16, seed=3
    )
    got = skn.lightning_indexer(case.query, case.key, case.weights, **case.kwargs(), impl="cpu")
    check_near_topk(got[:, 0], full_scores(case), tol=1e-5)


@pytest.mark.parametrize("topk", [256, 300])
@pytest.mark.parametrize("integer", [True, False])
def test_cpu_indexer_large_topk_estimated_cuts(isa, topk, integer):
    """k >= 256: the streaming top-k's buffer (4k) is cut at a threshold estimated from a sample
    (exact only at the end or when the estimate fails), several times per query over 3000 keys.
    Small-integer inputs (exact scores, real ties, to the earlier position) and random ones."""
    case = indexer_case(
        q_lens=[24, 1, 3],
        kv_lens=[3000, 2600, 1400],
        heads=8,
        dim=32,
        topk=topk,
        block_size=16,
        seed=topk,
        integer=integer,
    )
    ref_idx, ref_val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="reference"
    )
    got, got_val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="cpu"
    )
    if integer:
        check_same_selection(got[:, 0], ref_idx[:, 0], ref_val[:, 0], visible_counts(case))
        assert torch.equal(got_val[:, 0].sort(dim=-1).values, ref_val[:, 0].sort(dim=-1).values)
    else:
        check_near_topk(got[:, 0], full_scores(case), tol=1e-5)


def test_cpu_indexer_bf16(isa):
    case = indexer_case(**RAGGED, topk=8, dtype=torch.bfloat16, integer=True)
    ref_idx, ref_val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="reference"
    )
    got = skn.lightning_indexer(case.query, case.key, case.weights, **case.kwargs(), impl="cpu")
    check_same_selection(got[:, 0], ref_idx[:, 0], ref_val[:, 0], visible_counts(case))


# ------------------------------------------------------------------- indexer, bf16 scoring
BF16 = torch.bfloat16
SCORE_TOL = 1e-5  # relative to the row's largest |score|: float32 sums of exact bf16 products


def _rounded(case):
    """The case with query and keys rounded to bf16 (kept in float32): what bf16 scoring scores."""
    return dataclasses.replace(case, query=case.query.to(BF16).float(), key=case.key.to(BF16).float())


@pytest.mark.parametrize(
    "key_dtype", [torch.float32, BF16]
)  # float32 rows rounded in the kernel, or a bf16 cache
@pytest.mark.parametrize("block_size", [1, 16])
def test_cpu_indexer_bf16_scoring_random(isa, key_dtype, block_size):
    case = indexer_case(
        q_lens=[70, 1, 5, 1],
        kv_lens=[600, 300, 5, 1000],
        heads=16,
        dim=64,
        topk=64,
        block_size=block_size,
        seed=11,
    )
    case = dataclasses.replace(case, key=case.key.to(key_dtype))
    got, got_val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="cpu", score_dtype=BF16
    )
    exact = full_scores(_rounded(case))
    check_near_topk(got[:, 0], exact, tol=SCORE_TOL)
    check_values(got[:, 0], got_val[:, 0], exact, SCORE_TOL)
    ref_idx, ref_val = skn.lightning_indexer(
        case.query,
        case.key,
        case.weights,
        **case.kwargs(),
        return_value=True,
        impl="reference",
        score_dtype=BF16,
    )
    check_same_selection(got[:, 0], ref_idx[:, 0], ref_val[:, 0], visible_counts(case), tol=SCORE_TOL)
    # set equality with the reference except where two scores sit within float32 rounding at the k-th
    check_same_set_but_near_ties(got[:, 0], ref_idx[:, 0], ref_val[:, 0], exact, SCORE_TOL)
    # and it is bf16 scoring: the float32 scores of the unrounded inputs are not what came back
    f32 = full_scores(case)
    off = max(
        abs(float(v) - float(f32[t][int(i)])) / (float(f32[t].abs().max()) + 1e-6)
        for t in range(got.shape[0])
        for i, v in zip(got[t, 0], got_val[t, 0])
        if i >= 0
    )
    assert off > 1e-3


@pytest.mark.parametrize("topk", [4, 16, 200])
@pytest.mark.parametrize("block_size", [1, 4])
def test_cpu_indexer_bf16_scoring_exact_ties(isa, topk, block_size):
    """Small integers are exact in bf16 and every score is exact: the same set as the reference,
    ties to the earlier position, and the same score multiset."""
    case = indexer_case(**RAGGED, topk=topk, block_size=block_size, integer=True, seed=topk + 7 * block_size)
    ref_idx, ref_val = skn.lightning_indexer(
        case.query,
        case.key,
        case.weights,
        **case.kwargs(),
        return_value=True,
        impl="reference",
        score_dtype=BF16,
    )
    for key in (case.key, case.key.to(BF16)):
        got, got_val = skn.lightning_indexer(
            case.query, key, case.weights, **case.kwargs(), return_value=True, impl="cpu", score_dtype=BF16
        )
        check_same_selection(got[:, 0], ref_idx[:, 0], ref_val[:, 0], visible_counts(case))
        assert torch.equal(got_val[:, 0].sort(dim=-1).values, ref_val[:, 0].sort(dim=-1).values)


def test_cpu_indexer_bf16_inputs_score_in_bf16(isa):
    """bf16 query and keys are bf16 scoring without asking (the rounding is the identity)."""
    case = indexer_case(
        q_lens=[9, 1], kv_lens=[200, 90], heads=16, dim=64, topk=32, block_size=4, seed=5, dtype=BF16
    )
    a, va = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="cpu"
    )
    b, vb = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="cpu", score_dtype=BF16
    )
    assert torch.equal(a, b) and torch.equal(va, vb)
    exact = full_scores(_rounded(case))
    check_near_topk(a[:, 0], exact, tol=SCORE_TOL)
    check_values(a[:, 0], va[:, 0], exact, SCORE_TOL)


def test_cpu_indexer_float32_query_over_bf16_keys(isa):
    """score_dtype None with a bf16 key cache and a float32 query: float32 products of the values as
    given (the keys widened exactly, the query not rounded), without copying the cache."""
    case = indexer_case(q_lens=[9, 1], kv_lens=[200, 90], heads=8, dim=32, topk=16, block_size=4, seed=6)
    case = dataclasses.replace(case, key=case.key.to(BF16))
    got, val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="cpu"
    )
    exact = full_scores(dataclasses.replace(case, key=case.key.float()))
    check_near_topk(got[:, 0], exact, tol=SCORE_TOL)
    check_values(got[:, 0], val[:, 0], exact, SCORE_TOL)


def test_cpu_indexer_bf16_scoring_odd_head_dim(isa):
    """An odd head dim has no whole bf16 pairs: the kernel multiplies the rounded values in float32."""
    case = indexer_case(q_lens=[6, 1], kv_lens=[90, 40], heads=3, dim=33, topk=8, block_size=4, seed=8)
    got, val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="cpu", score_dtype=BF16
    )
    exact = full_scores(_rounded(case))
    check_near_topk(got[:, 0], exact, tol=SCORE_TOL)
    check_values(got[:, 0], val[:, 0], exact, SCORE_TOL)


def test_bf16_and_vnni_isas_are_picked_where_the_cpu_has_them():
    if not ISAS:
        pytest.skip("no CPU kernels")
    flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []
    vnni = "avx512f" in flags and "avx512_vnni" in flags  # int8 index scoring's vpdpbusd
    assert ("avx512vnni" in ISAS) == vnni
    assert ("avx512bf16" in ISAS) == (vnni and "avx512_bf16" in flags)
    assert ("avx2vnni" in ISAS) == ("avx2" in flags and "fma" in flags and "avx_vnni" in flags)
    with cpu.force_isa("auto"):
        assert cpu.active_isa() == ISAS[0]


def test_sglang_cpu_isa_reaches_the_dsa_kernels(monkeypatch):
    """One ISA vocabulary and one selector for both CPU kernel homes (sglang/srt/kernels/cpu/isa.py):
    SGLANG_CPU_ISA picks the DSA kernels' ISA as it picks SGLang's own build, old names included,
    and an ISA this CPU cannot run is refused."""
    if not ISAS:
        pytest.skip("no CPU kernels")
    from sglang.srt.kernels.cpu import isa

    assert tuple(cpu.ISAS) == tuple(isa.X86_ISAS) and tuple(cpu._ops.isas()) == tuple(isa.isas())
    assert ISAS == isa.runnable_isas()
    monkeypatch.delenv("SGLANG_CPU_ISA", raising=False)
    assert cpu.active_isa() == isa.select() == ISAS[0]
    for name in ISAS:
        monkeypatch.setenv("SGLANG_CPU_ISA", name)
        assert cpu.active_isa() == name == isa.select()
    monkeypatch.setenv("SGLANG_CPU_ISA", "generic")
    assert cpu.active_isa() == "portable"
    case = indexer_case(**RAGGED, topk=16, integer=True)  # the portable build's answer, exact
    ref_idx, ref_val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="reference"
    )
    idx = skn.lightning_indexer(case.query, case.key, case.weights, **case.kwargs(), impl="cpu")
    check_same_selection(idx[:, 0], ref_idx[:, 0], ref_val[:, 0], visible_counts(case))
    missing = [name for name in isa.isas() if name not in ISAS]
    if missing:  # a CPU without the best ISAs: asking for one is an error, not a SIGILL
        monkeypatch.setenv("SGLANG_CPU_ISA", missing[0])
        with pytest.raises(ValueError, match=f"cannot run the {missing[0]} kernels"):
            cpu.active_isa()
    monkeypatch.setenv("SGLANG_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match="SGLANG_CPU_ISA"):
        cpu.active_isa()


def test_bf16_dot_choice_is_checked(monkeypatch):
    monkeypatch.setenv("SGL_KERNEL_NPU_BF16_DOT", "amx")
    with pytest.raises(ValueError, match="SGL_KERNEL_NPU_BF16_DOT"):
        cpu.requested_bf16_dot()
    with pytest.raises(ValueError, match="bf16 dot"):
        with cpu.bf16_dot("amx"):
            pass


def test_score_dtype_is_checked():
    case = indexer_case(**RAGGED)
    with pytest.raises(ValueError, match="score_dtype"):
        skn.lightning_indexer(case.query, case.key, case.weights, **case.kwargs(), score_dtype=torch.float16)


def test_indexer_layouts_agree():
    """BSND queries / keys and TND keys give what the paged TND case gives."""
    gen = torch.Generator().manual_seed(1)
    b, s, n, d, k = 2, 6, 4, 16, 3
    q = torch.randn(b, s, n, d, generator=gen)
    keys = torch.randn(b, s, 1, d, generator=gen)
    w = torch.randn(b, s, n, generator=gen)
    for impl in ["reference"] + (["cpu"] if ISAS else []):
        bsnd = skn.lightning_indexer(
            q, keys, w, layout_query="BSND", layout_key="BSND", sparse_count=k, impl=impl
        )
        assert bsnd.shape == (b, s, 1, k)
        tnd = skn.lightning_indexer(
            q.reshape(b * s, n, d),
            keys.reshape(b * s, 1, d),
            w.reshape(b * s, n),
            actual_seq_lengths_query=[s, 2 * s],
            actual_seq_lengths_key=[s, 2 * s],
            layout_query="TND",
            layout_key="TND",
            sparse_count=k,
            impl=impl,
        )
        assert torch.equal(bsnd.reshape(b * s, k).sort(-1).values, tnd[:, 0].sort(-1).values)
        # mode 0: no causal mask, every query sees all s keys
        full = skn.lightning_indexer(q, keys, w, sparse_count=s, sparse_mode=0, impl=impl)
        assert (full >= 0).all()


def test_bad_arguments_are_clear_errors():
    case = indexer_case(**RAGGED)
    with pytest.raises(ValueError, match="layout_query"):
        skn.lightning_indexer(case.query, case.key, case.weights, **{**case.kwargs(), "layout_query": "SBH"})
    with pytest.raises(ValueError, match="sparse_mode"):
        skn.lightning_indexer(case.query, case.key, case.weights, **{**case.kwargs(), "sparse_mode": 1})
    with pytest.raises(ValueError, match="block_table"):
        skn.lightning_indexer(case.query, case.key, case.weights, **{**case.kwargs(), "block_table": None})
    with pytest.raises(ValueError, match="weights"):
        skn.lightning_indexer(case.query, case.key, case.weights[:, :2], **case.kwargs())
    with pytest.raises(ValueError, match="implementation"):
        skn.lightning_indexer(case.query, case.key, case.weights, **case.kwargs(), impl="cuda_magic")
