"""FP8 rows in the DSA ops (`--kv-cache-dtype fp8_*` on the `dsa` backend):

- `sparse_flash_attention` over float8_e4m3fn / float8_e5m2 latent rows with a `kv_scale`: the
  reference widens them (exact) times the scale, and equals float64 math on those values; the CPU
  kernels (every ISA build this machine runs) read the bytes in place and match the reference;
  float32 and bf16 queries, odd head counts and dims (vector tails);
- `lightning_indexer` over float8_e4m3fn index keys with per-128-value block scales (DeepSeek-V3.2's
  index-key format; the keys quantized by the pool's `quantize_index_k`): the reference scores the
  widened keys (code x block scale, float32) like float32 keys, at float32, bf16 and int8 scoring
  (so an FP8 cache works with the int8 scoring option); the CPU kernels match it (values within
  SCORE_TOL of the row's largest score, sets equal up to near-ties); head dims 72 (one partial
  block) and 160 (a full block and a partial one); Triton / torch_npu get the keys widened in torch;
- every FP8 code widens to the same float32 in the kernels' scalar table and vector loads (a
  sparse attention whose rows hold all 256 codes).
"""

from __future__ import annotations

import pytest
import torch

import sgl_kernel_npu as skn
from dsa_cases import check_same_set_but_near_ties, check_values, indexer_case, visible_counts
from sgl_kernel_npu.reference import widen_keys
from sglang.srt.mem_cache.mla_kv_pool import quantize_index_k
from test_dsa_indexer_int8 import isa, needs_cpu  # noqa: F401 (the fixture: every ISA build this CPU runs)
from dsa_cases import sfa_case

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
SCORE_TOL = 1e-5  # relative to the row's largest |score|: float32 sums in another order


def _fp8_rows(rows: torch.Tensor, dtype: torch.dtype, kv_scale: float) -> torch.Tensor:
    return (rows.float() / kv_scale).to(dtype)


def _exact_sfa(q, q_rope, rows, rope, idx, kw, scale):
    """float64 attention over the widened rows (rows [R, Dk], rope [R, Dr] float64)."""
    table, bs = kw["block_table"], kw["bs"]
    ends = kw["actual_seq_lengths_query"].long()
    q_lens = torch.diff(torch.cat([torch.zeros(1, dtype=torch.long), ends])).tolist()
    outs, t = [], 0
    for b, q_len in enumerate(q_lens):
        for _ in range(q_len):
            pos = torch.tensor([int(p) for p in idx[t, 0] if p >= 0], dtype=torch.long)
            r = table[b, pos // bs].long() * bs + pos % bs
            s = (q[t].double() @ rows[r].T + q_rope[t].double() @ rope[r].T) * scale
            empty = torch.zeros(q.shape[1], rows.shape[1], dtype=torch.float64)
            outs.append(torch.softmax(s, -1) @ rows[r] if pos.numel() else empty)
            t += 1
    return torch.stack(outs)


@pytest.mark.parametrize("dtype", FP8)
def test_reference_sparse_attention_widens_fp8_rows(dtype):
    q, key, idx, kw = sfa_case(q_lens=[3, 1, 6], kv_lens=[20, 9, 6], heads=5, dk=40, dr=8, topk=12)
    k8, r8 = _fp8_rows(key, dtype, 0.25), _fp8_rows(kw["key_rope"], dtype, 0.25)
    out, _ = skn.sparse_flash_attention(
        q, k8, k8, idx, 0.3, **dict(kw, key_rope=r8), impl="reference", kv_scale=0.25
    )
    rows = k8.reshape(-1, k8.shape[-1]).double() * 0.25
    rope = r8.reshape(-1, r8.shape[-1]).double() * 0.25
    want = _exact_sfa(q, kw["query_rope"], rows, rope, idx, dict(kw, bs=key.shape[1]), 0.3)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    plain, _ = skn.sparse_flash_attention(q, key, key, idx, 0.3, **kw, impl="reference")
    assert float((plain - out).abs().max()) > 1e-3  # the rounding is there (and would be noticed)


@needs_cpu
@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_cpu_sparse_attention_reads_fp8_rows(isa, dtype, q_dtype):
    spec = dict(q_lens=[5, 1, 20, 1], kv_lens=[30, 7, 20, 90], heads=5, dk=40, dr=8, topk=24)
    q, key, idx, kw = sfa_case(**spec, dtype=q_dtype)
    kw = dict(kw, key_rope=_fp8_rows(kw["key_rope"], dtype, 0.5))
    k8 = _fp8_rows(key, dtype, 0.5)
    ro, rl = skn.sparse_flash_attention(q, k8, k8, idx, 0.3, **kw, impl="reference", kv_scale=0.5)
    co, cl = skn.sparse_flash_attention(q, k8, k8, idx, 0.3, **kw, impl="cpu", kv_scale=0.5)
    assert co.dtype == q_dtype
    tol = 2e-6 if q_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(co.float(), ro.float(), atol=tol, rtol=1e-5 if tol < 1e-3 else 1e-2)
    torch.testing.assert_close(cl, rl, atol=2e-6 if tol < 1e-3 else 1e-4, rtol=1e-4)


@needs_cpu
@pytest.mark.parametrize("dtype", FP8)
def test_every_fp8_code_widens_alike_in_scalar_and_vector_paths(isa, dtype):
    """One query over 8 rows holding all 256 codes (NaN / inf codes replaced by 0: they would make
    every output NaN): the value part (64 dims: vector loads) and rope part (32: scalar table)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    wide = codes.view(dtype).float()
    codes = torch.where(torch.isfinite(wide), codes, torch.zeros_like(codes)).view(8, 32)
    rows = torch.cat([codes, codes.flip(1)], dim=1).contiguous().view(dtype).view(1, 8, 1, 64)
    rope = codes.contiguous().view(dtype).view(1, 8, 1, 32)
    gen = torch.Generator().manual_seed(30)  # unseeded, one draw in a full run missed rtol (2.6e-5)
    q = torch.randn(1, 3, 64, generator=gen) * 1e-3
    qr = torch.randn(1, 3, 32, generator=gen) * 1e-3
    idx = torch.arange(8, dtype=torch.int32).view(1, 1, 8)
    kw = dict(
        block_table=torch.zeros((1, 1), dtype=torch.int32),
        actual_seq_lengths_query=torch.tensor([1]),
        actual_seq_lengths_kv=torch.tensor([8]),
        query_rope=qr,
        key_rope=rope,
        layout_query="TND",
        layout_kv="PA_BSND",
        sparse_mode=3,
    )
    ro = skn.sparse_flash_attention(q, rows, rows, idx, 1.0, **kw, impl="reference", kv_scale=2.0)
    co = skn.sparse_flash_attention(q, rows, rows, idx, 1.0, **kw, impl="cpu", kv_scale=2.0)
    assert torch.isfinite(ro).all()
    # values up to 2 x 57344 (e5m2) summed with cancellation: float32 order differences reach ~3e-5
    torch.testing.assert_close(co, ro, atol=1e-6 * float(ro.abs().max()), rtol=1e-4)


def _fp8_keys(case):
    """The case's keys as the FP8 pool stores them: codes [blocks, bs, 1, D], scales [.., 1, nb]."""
    dim = case.key.shape[-1]
    codes, scale = quantize_index_k(case.key.reshape(-1, dim))
    return codes.view(case.key.shape), scale.view(*case.key.shape[:-1], -1)


def _widened_scores(case, codes, scale):
    """float64 scores of every visible key of every query, on the widened keys."""
    dim = codes.shape[-1]
    wide = widen_keys(codes.reshape(-1, dim), scale.reshape(codes.numel() // dim, -1))
    out, start, bs = [], 0, case.key.shape[1]
    for b, (q_len, kv_len) in enumerate(zip(case.q_lens, case.kv_lens.tolist())):
        pos = torch.arange(kv_len)
        keys = wide[case.block_table[b, pos // bs].long() * bs + pos % bs].double()
        for i in range(q_len):
            s = torch.relu(case.query[start + i].double() @ keys.T)
            w = case.weights[start + i].double().unsqueeze(1)
            out.append((w * s).sum(0)[: max(0, kv_len - q_len + i + 1)])
        start += q_len
    return out


@pytest.mark.parametrize("dim", [72, 160])
def test_fp8_index_keys_quantize_per_128_block_and_reference_scores_them_widened(dim):
    case = indexer_case([5, 1, 37], [40, 9, 37], heads=4, dim=dim, topk=8)
    codes, scale = _fp8_keys(case)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape[-1] == -(-dim // 128)
    flat = case.key.reshape(-1, dim)
    wide = widen_keys(codes.reshape(-1, dim), scale.reshape(flat.shape[0], -1))
    # within e4m3's half ulp (2^-4 relative) of each block's values; the block's largest uses 448
    assert float(((wide - flat).abs() - flat.abs() / 15).max()) <= 1e-6
    assert float(codes.float().abs().amax()) == 448.0
    idx, val = skn.lightning_indexer(
        case.query, codes, case.weights, **case.kwargs(), impl="reference", key_scale=scale, return_value=True
    )
    check_values(idx[:, 0], val[:, 0], _widened_scores(case, codes, scale), 1e-6)
    with pytest.raises(ValueError, match="float8_e4m3fn with key_scale"):
        skn.lightning_indexer(case.query, codes, case.weights, **case.kwargs(), impl="reference")


@needs_cpu
@pytest.mark.parametrize("score_dtype", [None, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("dim", [72, 160])
def test_cpu_indexer_reads_fp8_index_keys(isa, score_dtype, dim):
    case = indexer_case([5, 1, 37, 1, 3], [40, 9, 37, 130, 2], heads=5, dim=dim, topk=16, block_size=4)
    codes, scale = _fp8_keys(case)
    kw = dict(case.kwargs(), key_scale=scale, return_value=True, score_dtype=score_dtype)
    ri, rv = skn.lightning_indexer(case.query, codes, case.weights, **kw, impl="reference")
    ci, cv = skn.lightning_indexer(case.query, codes, case.weights, **kw, impl="cpu")
    vis = visible_counts(case)
    for t in range(ci.shape[0]):
        assert (ci[t, 0] >= 0).sum() == min(vis[t], case.topk)
        # a key both pick has the reference's score (at this scoring precision) within float32 sums
        ref = {int(p): float(v) for p, v in zip(ri[t, 0], rv[t, 0]) if p >= 0}
        largest = max((abs(v) for v in ref.values()), default=0.0) + 1e-6
        for p, v in zip(ci[t, 0].tolist(), cv[t, 0].tolist()):
            if p in ref:
                assert abs(v - ref[p]) <= SCORE_TOL * largest, (t, p, v, ref[p])
    # sets equal up to near-ties (judged on the widened keys' float64 scores: bf16 / int8 scoring
    # moves scores by up to ~1 % of the largest)
    tol = 1e-5 if score_dtype is None else 2e-2
    check_same_set_but_near_ties(ci[:, 0], ri[:, 0], rv[:, 0], _widened_scores(case, codes, scale), tol)


def test_triton_and_npu_get_fp8_keys_widened_in_torch():
    """The fallback for implementations without FP8 kernels: float32 keys of code x scale."""
    case = indexer_case([2, 1], [20, 9], heads=2, dim=72, topk=4)
    codes, scale = _fp8_keys(case)
    wide, none = skn._widen_for("triton", codes, scale)
    assert none is None and wide.dtype == torch.float32 and wide.shape == codes.shape
    torch.testing.assert_close(
        wide.reshape(-1, 72), widen_keys(codes.reshape(-1, 72), scale.reshape(-1, 1)), atol=0, rtol=0
    )
    assert skn._widen_for("cpu", codes, scale)[0] is codes
