"""The Lightning Indexer's int8 scoring (`score_dtype=torch.int8`): per-row symmetric int8 query heads
and keys (`reference.quantize_int8`), exact integer dot products, score = s_k * sum_h (w_h * s_qh) *
relu(q8_h . k8).

- the reference's quantization (range, round-half-even, zero rows) and its scores against exact
  float64 math on the quantized values, and against the float32 scores of the unquantized inputs
  (within the quantization error bound, high top-k overlap);
- the fused CPU kernel against the reference on every build this CPU runs (vpdpbusd on avx512bf16,
  avx512vnni and avx2vnni, vpmaddwd on avx512 / avx2, plain C++ on portable; which builds a CPU runs:
  test_dsa_ops_cpu.py): ragged batches, paged keys with shuffled
  blocks, float32 and bf16 key caches, top-k >= the visible keys, causal edges (queries that
  outnumber their keys); exactly (set and values) where every row's amax is 127 (scale 1: the
  scores are exact small integers, so ties are real), else values within float32 rounding of the
  head sum and sets equal up to near-ties;
- an int8 key cache (int8 rows + per-row `key_scale`) scores exactly like quantizing in the call.
"""

from __future__ import annotations

import dataclasses

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
    visible_counts,
)
from sgl_kernel_npu import cpu
from sgl_kernel_npu.reference import quantize_int8

I8 = torch.int8
ISAS = cpu.supported_isas() if cpu.available() else []
RAGGED = dict(q_lens=[5, 1, 37, 1, 3], kv_lens=[40, 9, 37, 130, 2])
LONG = dict(q_lens=[70, 1, 5, 1], kv_lens=[600, 300, 5, 1000], heads=16, dim=64, topk=64)
SCORE_TOL = 1e-5  # relative to the row's largest |score|: exact integer dots, float32 head sums and scales

needs_cpu = pytest.mark.skipif(not ISAS, reason="sgl_kernel_npu built without its CPU kernels")


@pytest.fixture(params=ISAS)
def isa(request):
    with cpu.force_isa(request.param):
        assert cpu.active_isa() == request.param
        yield request.param


def _quantized(case):
    """The case as int8 scoring sees it, in float64: integer queries, head weights times the query
    scales (float32, as the kernel forms them), keys k8 * s_k (exact in float64)."""
    q8, sq = quantize_int8(case.query)
    k8, sk = quantize_int8(case.key)
    return dataclasses.replace(
        case,
        query=q8.double(),
        key=k8.double() * sk.double().unsqueeze(-1),
        weights=case.weights.float() * sq,
    )


def _scale_127(case):
    """Small-integer inputs with one +-127 per row: every scale is exactly 1, so int8 scoring sees
    the values as given and every score is an exact float32 integer."""
    q, k = case.query.clone(), case.key.clone()
    q[..., 0] = 127.0
    k[..., 1] = torch.where(torch.arange(k[..., 1].numel()).view_as(k[..., 1]) % 2 == 0, 127.0, -127.0)
    return dataclasses.replace(case, query=q, key=k)


def _run(case, impl, **kw):
    return skn.lightning_indexer(
        case.query,
        case.key,
        case.weights,
        **case.kwargs(),
        return_value=True,
        impl=impl,
        score_dtype=I8,
        **kw,
    )


def test_quantize_int8():
    x = torch.tensor([[0.5, -1.0, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0], [2.54, 1.27, -0.01, 0.03]])
    q, s = quantize_int8(x)
    assert q.dtype == torch.int8 and s.dtype == torch.float32
    assert q[0].tolist() == [64, -127, 32, 0]  # 63.5 -> 64 (half to even), 31.75 -> 32
    assert q[1].tolist() == [0, 0, 0, 0] and float(s[1]) == 0.0
    assert q[2].tolist() == [127, 64, 0, 2]  # 63.5 -> 64, 1.5 -> 2
    torch.testing.assert_close(s, torch.tensor([1 / 127, 0.0, 2.54 / 127]))
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(50, 64, generator=gen) * torch.rand(50, 1, generator=gen) * 10
    qy, sy = quantize_int8(y)
    assert (qy.abs().amax(-1) == 127).all() and int(qy.min()) >= -127
    assert ((qy.float() * sy.unsqueeze(-1) - y).abs() <= sy.unsqueeze(-1) / 2 * (1 + 1e-5)).all()


def test_reference_int8_is_exact_integer_math():
    case = indexer_case(**LONG, block_size=16, seed=11)
    idx, val = _run(case, "reference")
    exact = full_scores(_quantized(case))
    check_near_topk(idx[:, 0], exact, tol=SCORE_TOL)
    check_values(idx[:, 0], val[:, 0], exact, SCORE_TOL)


def test_reference_int8_close_to_float32():
    """int8 scores differ from the float32 scores of the unquantized inputs by at most the
    quantization bound (|x - x8 * s| <= s / 2 per element, s = amax / 127):
    |err| <= sum_h |w_h| (|q_h|_1 s_k / 2 + |k|_1 s_qh / 2 + D s_qh s_k / 4), and most of the
    float32 top-k survives (mean overlap >= 0.95 on these random inputs; 0.99 measured)."""
    case = indexer_case(**LONG, block_size=16, seed=2)
    idx, val = _run(case, "reference")
    f32_idx = skn.lightning_indexer(case.query, case.key, case.weights, **case.kwargs(), impl="reference")
    _, sq = quantize_int8(case.query)
    _, sk = quantize_int8(case.key)
    f32 = full_scores(case)
    keys = case.key.reshape(-1, case.key.shape[-1]).double()
    kscale = sk.reshape(-1).double()
    bs, t0, overlaps = case.key.shape[1], 0, []
    for b, (q_len, kv_len) in enumerate(zip(case.q_lens, case.kv_lens.tolist())):
        pos = torch.arange(kv_len)
        rows = case.block_table[b, pos // bs].long() * bs + pos % bs
        for i in range(q_len):
            t = t0 + i
            w, q, s_q = case.weights[t].double().abs(), case.query[t].double(), sq[t].double()
            bound = (
                w.unsqueeze(1)
                * (
                    q.abs().sum(-1, keepdim=True) * kscale[rows] / 2
                    + keys[rows].abs().sum(-1) * s_q.unsqueeze(1) / 2
                    + q.shape[-1] * s_q.unsqueeze(1) * kscale[rows] / 4
                )
            ).sum(0)
            for j, v in zip(idx[t, 0].tolist(), val[t, 0].tolist()):
                if j >= 0:
                    assert abs(v - float(f32[t][j])) <= float(bound[j]) * (1 + 1e-4) + 1e-6, (t, j)
            ref = set(f32_idx[t, 0].tolist()) - {-1}
            if ref:
                overlaps.append(len(ref & set(idx[t, 0].tolist())) / len(ref))
        t0 += q_len
    assert sum(overlaps) / len(overlaps) >= 0.95 and min(overlaps) >= 0.8, overlaps
    # and it is int8 scoring: the values are not the float32 scores
    assert (
        max(
            abs(v - float(f32[t][j]))
            for t in range(idx.shape[0])
            for j, v in zip(idx[t, 0].tolist(), val[t, 0].tolist())
            if j >= 0
        )
        > 1e-4
    )


@needs_cpu
@pytest.mark.parametrize("key_dtype", [torch.float32, torch.bfloat16])  # a float32 or a bf16 key cache
@pytest.mark.parametrize("block_size", [1, 16])
def test_cpu_int8_matches_reference(isa, key_dtype, block_size):
    case = indexer_case(**LONG, block_size=block_size, seed=7 + block_size)
    case = dataclasses.replace(case, key=case.key.to(key_dtype))
    got, got_val = _run(case, "cpu")
    ref_idx, ref_val = _run(case, "reference")
    exact = full_scores(_quantized(dataclasses.replace(case, key=case.key.float())))
    check_near_topk(got[:, 0], exact, tol=SCORE_TOL)
    check_values(got[:, 0], got_val[:, 0], exact, SCORE_TOL)
    check_same_selection(got[:, 0], ref_idx[:, 0], ref_val[:, 0], visible_counts(case), tol=SCORE_TOL)
    check_same_set_but_near_ties(got[:, 0], ref_idx[:, 0], ref_val[:, 0], exact, SCORE_TOL)


@needs_cpu
def test_cpu_int8_odd_shapes(isa):
    """A head dim that fills no whole 4-byte (vpdpbusd) or int16-pair word, and a head count that is
    no multiple of the register block (the one-head tail)."""
    case = indexer_case(q_lens=[20, 1], kv_lens=[150, 70], heads=7, dim=37, topk=16, block_size=4, seed=9)
    got, got_val = _run(case, "cpu")
    exact = full_scores(_quantized(case))
    check_near_topk(got[:, 0], exact, tol=SCORE_TOL)
    check_values(got[:, 0], got_val[:, 0], exact, SCORE_TOL)


@needs_cpu
@pytest.mark.parametrize("topk", [4, 16, 200])  # 200 >= every request's keys
@pytest.mark.parametrize("block_size", [1, 4])
def test_cpu_int8_exact_ties(isa, topk, block_size):
    """Every scale 1 (`_scale_127`): exact scores, so the same set as the reference (ties to the
    earlier position) and the same score multiset; also without values (rows that see <= topk keys
    answered without scoring). RAGGED has a request whose queries outnumber its keys."""
    case = _scale_127(
        indexer_case(**RAGGED, topk=topk, block_size=block_size, integer=True, seed=topk + block_size)
    )
    ref_idx, ref_val = _run(case, "reference")
    got, got_val = _run(case, "cpu")
    vis = visible_counts(case)
    check_same_selection(got[:, 0], ref_idx[:, 0], ref_val[:, 0], vis)
    assert torch.equal(got_val[:, 0].sort(dim=-1).values, ref_val[:, 0].sort(dim=-1).values)
    assert torch.equal(ref_val, ref_val.round())  # integer scores: the inputs reached the kernel unscaled
    plain = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), impl="cpu", score_dtype=I8
    )
    check_same_selection(plain[:, 0], ref_idx[:, 0], ref_val[:, 0], vis)


@needs_cpu
def test_int8_key_cache(isa):
    """int8 key rows + key_scale (quantized once, as a cache would store them) score exactly like
    float keys quantized in the call, in the kernel and in the reference; int8 keys imply int8
    scoring."""
    case = indexer_case(**LONG, block_size=16, seed=4)
    k8, sk = quantize_int8(case.key)
    cached = dataclasses.replace(case, key=k8)
    for impl in ("reference", "cpu"):
        want_idx, want_val = _run(case, impl)
        got_idx, got_val = _run(cached, impl, key_scale=sk)
        assert torch.equal(got_idx.sort(-1).values, want_idx.sort(-1).values), impl
        assert torch.equal(got_val.sort(-1).values, want_val.sort(-1).values), impl
        implied = skn.lightning_indexer(
            case.query, k8, case.weights, **case.kwargs(), impl=impl, key_scale=sk
        )
        assert torch.equal(implied.sort(-1).values, want_idx.sort(-1).values), impl


def test_int8_arguments_are_checked():
    case = indexer_case(**RAGGED)
    k8, sk = quantize_int8(case.key)
    with pytest.raises(ValueError, match="key_scale"):
        skn.lightning_indexer(case.query, k8, case.weights, **case.kwargs(), impl="reference")
    with pytest.raises(ValueError, match="int8"):
        skn.lightning_indexer(
            case.query,
            k8,
            case.weights,
            **case.kwargs(),
            impl="reference",
            key_scale=sk,
            score_dtype=torch.bfloat16,
        )
    with pytest.raises(ValueError, match="key_scale"):
        skn.lightning_indexer(
            case.query, k8, case.weights, **case.kwargs(), impl="reference", key_scale=sk[:3]
        )
    with pytest.raises(NotImplementedError, match="torch_npu"):
        skn.lightning_indexer(
            case.query, case.key, case.weights, **case.kwargs(), impl="torch_npu", score_dtype=I8
        )
