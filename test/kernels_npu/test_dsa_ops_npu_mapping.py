"""The torch_npu implementation of sgl_kernel_npu's DSA ops, against a STAND-IN `torch_npu` module: we
have no NPU. The stand-in records every call and computes the op from its documented semantics
(TND queries with cumulative lengths, PA_BSND keys through the block table with per-request key
lengths, sparse_mode 3 right-down causal, MLA-absorb attention returning (out, softmax_max,
softmax_sum)), written here independently of the package's layout code. So the tests check the
argument mapping (names, layouts, dtypes, modes) and that the results the mapping hands back match
the torch reference; they say nothing about CANN's kernels themselves.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

import sgl_kernel_npu as skn
from dsa_cases import check_same_selection, indexer_case, visible_counts
from dsa_cases import sfa_case


def _per_request(cu_q, kv_lens):
    ends = cu_q.tolist()
    starts = [0] + ends[:-1]
    return [(b, s, e, int(kv_lens[b])) for b, (s, e) in enumerate(zip(starts, ends))]


def _rows(cache, table, b, positions):
    bs = cache.shape[1]
    flat = cache.reshape(-1, cache.shape[-1])
    return flat[table[b, positions // bs].long() * bs + positions % bs]


class StandIn(types.ModuleType):
    def __init__(self):
        super().__init__("torch_npu")
        self.calls: list[tuple[str, dict]] = []

    def npu_lightning_indexer(self, **kw):
        self.calls.append(("npu_lightning_indexer", kw))
        assert kw["layout_query"] == "TND" and kw["layout_key"] == "PA_BSND" and kw["sparse_mode"] == 3
        q, cache, w, k = kw["query"], kw["key"], kw["weights"], kw["sparse_count"]
        idx = torch.full((q.shape[0], 1, k), -1, dtype=torch.int32)
        val = torch.full((q.shape[0], 1, k), float("-inf"))
        for b, s, e, kv in _per_request(kw["actual_seq_lengths_query"], kw["actual_seq_lengths_key"]):
            keys = _rows(cache, kw["block_table"], b, torch.arange(kv)).float()
            for t in range(s, e):
                vis = kv - (e - s) + (t - s) + 1  # right-down causal
                if vis <= 0:
                    continue
                sc = (torch.relu(q[t].float() @ keys[:vis].T) * w[t].float().unsqueeze(1)).sum(0)
                order = sorted(range(vis), key=lambda j: (-float(sc[j]), j))[:k]
                idx[t, 0, : len(order)] = torch.tensor(order, dtype=torch.int32)
                val[t, 0, : len(order)] = sc[order]
        return idx, val

    def npu_sparse_flash_attention(self, **kw):
        self.calls.append(("npu_sparse_flash_attention", kw))
        assert kw["attention_mode"] == 2 and kw["layout_query"] == "TND" and kw["layout_kv"] == "PA_BSND"
        q, qr, sel = kw["query"], kw["query_rope"], kw["sparse_indices"]
        t_total, heads = q.shape[:2]
        out = torch.zeros(t_total, heads, kw["value"].shape[-1])
        smax = torch.full((1, t_total, heads), float("-inf"))
        ssum = torch.zeros(1, t_total, heads)
        for b, s, e, kv in _per_request(kw["actual_seq_lengths_query"], kw["actual_seq_lengths_kv"]):
            for t in range(s, e):
                limit = kv - (e - s) + (t - s) + 1
                pos = torch.tensor([int(p) for p in sel[t, 0] if 0 <= p < limit], dtype=torch.long)
                if pos.numel() == 0:
                    continue
                k = _rows(kw["key"], kw["block_table"], b, pos).float()
                kr = _rows(kw["key_rope"], kw["block_table"], b, pos).float()
                v = _rows(kw["value"], kw["block_table"], b, pos).float()
                sc = (q[t].float() @ k.T + qr[t].float() @ kr.T) * kw["scale_value"]
                m = sc.max(-1).values
                p = torch.exp(sc - m.unsqueeze(1))
                smax[0, t], ssum[0, t] = m, p.sum(-1)
                out[t] = (p / p.sum(-1, keepdim=True)) @ v
        out = out.to(q.dtype)
        return (out, smax, ssum) if kw["return_softmax_lse"] else (out,)


@pytest.fixture
def stand_in(monkeypatch):
    mod = StandIn()
    monkeypatch.setitem(sys.modules, "torch_npu", mod)
    return mod


def test_indexer_mapping(stand_in):
    case = indexer_case(q_lens=[5, 1, 9], kv_lens=[40, 9, 30], topk=8, integer=True, block_size=16)
    got, vals = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="torch_npu"
    )
    name, kw = stand_in.calls[-1]
    assert name == "npu_lightning_indexer"
    assert kw["weights"].dtype == case.query.dtype and kw["return_value"] is True and kw["sparse_count"] == 8
    for arg in ("actual_seq_lengths_query", "actual_seq_lengths_key", "block_table"):
        assert kw[arg].dtype == torch.int32
    assert kw["actual_seq_lengths_query"].tolist() == case.cu_q.tolist()  # TND: cumulative
    assert kw["actual_seq_lengths_key"].tolist() == case.kv_lens.tolist()  # PA_BSND: per request
    assert kw["key"] is case.key and kw["query"] is case.query  # no copies, no re-layout
    ref_idx, ref_val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="reference"
    )
    check_same_selection(got[:, 0], ref_idx[:, 0], ref_val[:, 0], visible_counts(case))
    assert "return_value" not in dict(
        (
            skn.lightning_indexer(case.query, case.key, case.weights, **case.kwargs(), impl="torch_npu"),
            stand_in.calls[-1],
        )[1][1]
    )


def test_sparse_attention_mapping(stand_in):
    q, key, idx, kw = sfa_case(q_lens=[5, 1, 20, 1], kv_lens=[30, 7, 20, 90], block_size=16)
    out, lse = skn.sparse_flash_attention(q, key, key, idx, 0.3, **kw, impl="torch_npu")
    name, call = stand_in.calls[-1]
    assert (
        name == "npu_sparse_flash_attention"
        and call["attention_mode"] == 2
        and call["sparse_block_size"] == 1
    )
    assert call["sparse_indices"].dtype == torch.int32 and call["return_softmax_lse"] is True
    assert call["actual_seq_lengths_query"].tolist() == kw["actual_seq_lengths_query"].tolist()
    ro, rl = skn.sparse_flash_attention(q, key, key, idx, 0.3, **kw, impl="reference")
    torch.testing.assert_close(out, ro, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, rl, atol=1e-5, rtol=1e-5)
    plain = skn.sparse_flash_attention(
        q, key, key, idx, 0.3, **{**kw, "return_softmax_lse": False}, impl="torch_npu"
    )
    torch.testing.assert_close(plain, ro, atol=1e-5, rtol=1e-5)


def test_npu_platform_picks_torch_npu():
    from sglang.srt.platforms import get_platform

    assert get_platform("npu").dsa_ops_impl == "torch_npu"
    assert get_platform("cuda").dsa_ops_impl == "triton"
    assert get_platform("cpu").dsa_ops_impl == "cpu"


def test_missing_torch_npu_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import fails
    case = indexer_case(q_lens=[2], kv_lens=[4])
    with pytest.raises(ImportError, match="torch_npu"):
        skn.lightning_indexer(case.query, case.key, case.weights, **case.kwargs(), impl="torch_npu")


def test_indexer_bf16_scoring_hands_bf16_to_the_op(stand_in):
    """score_dtype=bf16: the op gets bf16 query and key (it scores in its inputs' dtype)."""
    case = indexer_case(q_lens=[3, 1], kv_lens=[20, 12], topk=4, integer=True, block_size=16)
    got = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), impl="torch_npu", score_dtype=torch.bfloat16
    )
    kw = stand_in.calls[-1][1]
    assert kw["query"].dtype == kw["key"].dtype == kw["weights"].dtype == torch.bfloat16
    ref_idx, ref_val = skn.lightning_indexer(
        case.query, case.key, case.weights, **case.kwargs(), return_value=True, impl="reference"
    )
    check_same_selection(
        got[:, 0], ref_idx[:, 0], ref_val[:, 0], visible_counts(case)
    )  # integers: exact in bf16
