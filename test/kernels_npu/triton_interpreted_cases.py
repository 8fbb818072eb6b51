"""sgl_kernel_npu's Triton DSA kernels against the torch reference, run by Triton's interpreter on CPU
(TRITON_INTERPRET=1, float32): the same kernels run compiled on CUDA and triton-ascend; we have no GPU
or NPU here, so only their semantics are tested, not their speed or their compiled form.

Run by test_dsa_ops_triton.py in a fresh process whose environment has TRITON_INTERPRET=1 from the
start: triton's own library functions (tl.sum, tl.max, ...) are jitted when triton is first
imported, so a process that imported triton earlier cannot switch to the interpreter.

Cases: ragged batches over paged keys with shuffled blocks, top-k >= the visible keys, causal edges;
indexer picks compared as sets (exactly on small-integer inputs, where ties are real).
"""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # effective only if triton is not imported yet (see above)

import pytest
import torch

triton = pytest.importorskip("triton")

import sgl_kernel_npu as skn  # noqa: E402
from dsa_cases import check_near_topk, check_same_selection, full_scores, indexer_case, visible_counts  # noqa: E402
from dsa_cases import SFA_CASES, sfa_case  # noqa: E402

RAGGED = dict(q_lens=[3, 1, 9, 1], kv_lens=[20, 9, 9, 70])


@pytest.mark.parametrize("topk", [4, 100])
def test_triton_indexer_exact(topk):
    case = indexer_case(**RAGGED, topk=topk, integer=True, seed=topk)
    ref_idx, ref_val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="reference"
    )
    got, got_val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="triton"
    )
    check_same_selection(got[:, 0], ref_idx[:, 0], ref_val[:, 0], visible_counts(case))
    assert torch.equal(got, ref_idx)  # same order too: both sort stably by score
    torch.testing.assert_close(got_val, ref_val)


def test_triton_indexer_random():
    case = indexer_case(q_lens=[6, 1], kv_lens=[80, 150], heads=16, dim=64, topk=32, block_size=16, seed=4)
    got = skn.lightning_indexer(case.query, case.key, case.weights, **case.kwargs(), impl="triton")
    check_near_topk(got[:, 0], full_scores(case), tol=1e-5)


def test_triton_indexer_bf16_scoring():
    """score_dtype bf16: the kernel scores the bf16-rounded inputs (float32 sums), like the reference."""
    case = indexer_case(q_lens=[6, 1], kv_lens=[80, 150], heads=16, dim=64, topk=32, block_size=16, seed=5)
    got, val = skn.lightning_indexer(
        case.query,
        case.key,
        case.weights,
        **case.kwargs(),
        return_value=True,
        impl="triton",
        score_dtype=torch.bfloat16,
    )
    rounded = dataclasses.replace(case, query=case.query.bfloat16().float(), key=case.key.bfloat16().float())
    check_near_topk(got[:, 0], full_scores(rounded), tol=1e-5)
    _, ref_val = skn.lightning_indexer(
        case.query,
        case.key,
        case.weights,
        **case.kwargs(),
        return_value=True,
        impl="reference",
        score_dtype=torch.bfloat16,
    )
    torch.testing.assert_close(val.sort(-1).values, ref_val.sort(-1).values, atol=1e-4, rtol=1e-5)


def test_triton_indexer_int8_scoring():
    """score_dtype int8: the reference's quantization, float32 products of the int8 values with the
    dequantized keys: the reference's int8 scores up to float32 rounding."""
    case = indexer_case(q_lens=[6, 1], kv_lens=[80, 150], heads=16, dim=64, topk=32, block_size=16, seed=6)
    got, val = skn.lightning_indexer(
        case.query,
        case.key,
        case.weights,
        **case.kwargs(),
        return_value=True,
        impl="triton",
        score_dtype=torch.int8,
    )
    ref_idx, ref_val = skn.lightning_indexer(
        case.query,
        case.key,
        case.weights,
        **case.kwargs(),
        return_value=True,
        impl="reference",
        score_dtype=torch.int8,
    )
    check_same_selection(got[:, 0], ref_idx[:, 0], ref_val[:, 0], visible_counts(case), tol=1e-5)
    torch.testing.assert_close(val.sort(-1).values, ref_val.sort(-1).values, atol=1e-4, rtol=1e-5)
    f32 = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="triton"
    )
    assert not torch.allclose(val, f32[1])  # int8 scores, not the float32 ones


@pytest.mark.parametrize("spec", SFA_CASES)
def test_triton_sparse_attention(spec):
    q, key, idx, kw = sfa_case(**spec)
    ro, rl = skn.sparse_flash_attention(q, key, key, idx, 0.3, **kw, impl="reference")
    to, tl_ = skn.sparse_flash_attention(q, key, key, idx, 0.3, **kw, impl="triton")
    torch.testing.assert_close(to, ro, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(tl_, rl, atol=2e-6, rtol=1e-5)


def test_triton_fp8_rows_widened_in_torch():
    """FP8 latent rows (kv_scale) and FP8 index keys (block scales): the Triton path gets them
    widened in torch (the front's fallback) and matches the reference reading them as stored."""
    from sglang.srt.mem_cache.mla_kv_pool import quantize_index_k

    q, key, idx, kw = sfa_case(**SFA_CASES[0])
    k8, r8 = (key / 0.5).to(torch.float8_e5m2), (kw["key_rope"] / 0.5).to(torch.float8_e5m2)
    kw = {**kw, "key_rope": r8}
    ro, rl = skn.sparse_flash_attention(q, k8, k8, idx, 0.3, **kw, impl="reference", kv_scale=0.5)
    to, tl_ = skn.sparse_flash_attention(q, k8, k8, idx, 0.3, **kw, impl="triton", kv_scale=0.5)
    torch.testing.assert_close(to, ro, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(tl_, rl, atol=2e-6, rtol=1e-5)
    case = indexer_case([3, 1], [20, 9], dim=40, topk=4, integer=True)
    codes, scale = quantize_index_k(case.key.reshape(-1, 40))
    codes, scale = codes.view(case.key.shape), scale.view(*case.key.shape[:-1], 1)
    kw = dict(case.kwargs(), key_scale=scale, return_value=True)
    ri, rv = skn.lightning_indexer(case.query, codes, case.weights, **kw, impl="reference")
    ti, tv = skn.lightning_indexer(case.query, codes, case.weights, **kw, impl="triton")
    torch.testing.assert_close(tv, rv, atol=1e-4, rtol=1e-5)
    assert [set(a.tolist()) for a in ti[:, 0]] == [set(a.tolist()) for a in ri[:, 0]]


def test_triton_sparse_attention_without_rope():
    q, key, idx, kw = sfa_case(**SFA_CASES[0])
    kw = {**kw, "query_rope": None, "key_rope": None}
    ro, rl = skn.sparse_flash_attention(q, key, key, idx, 0.3, **kw, impl="reference")
    to, tl_ = skn.sparse_flash_attention(q, key, key, idx, 0.3, **kw, impl="triton")
    torch.testing.assert_close(to, ro, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(tl_, rl, atol=2e-6, rtol=1e-5)


def test_triton_merge():
    gen = torch.Generator().manual_seed(0)
    outs = [torch.randn(3, 4, 40, generator=gen) for _ in range(3)]
    lses = [torch.randn(3, 4, generator=gen) for _ in range(3)]
    lses[2][1, 1] = float("-inf")
    for p in range(3):
        lses[p][2, 3] = float("-inf")
    ro, rl = skn.merge_attn_states([o.clone() for o in outs], lses, impl="reference")
    to, tl_ = skn.merge_attn_states(outs, lses, impl="triton")
    torch.testing.assert_close(to, ro, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(tl_, rl, atol=1e-6, rtol=1e-6)
    assert torch.isinf(tl_[2, 3]) and (to[2, 3] == 0).all()
