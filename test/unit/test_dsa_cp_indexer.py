"""Pure pieces of DSA under context parallelism: the Lightning Indexer's selection from own queries
and from merged per-shard candidates equals single-rank top-k (ties to the earlier position), and
selected-token attention split over key shards merges (by LSE) into the unsplit result."""

from __future__ import annotations

import torch

from sglang.srt.layers.attention.dsa import cp_indexer
from sglang.srt.layers.attention.dsa.cp_indexer import own_query_topk, shard_topk_candidates
from sglang.srt.layers.attention.dsa.scoring import index_scores, merge_candidates, select_topk
from sglang.srt.layers.attention.dsa.sparse_attention import sparse_latent_attention
from sglang.srt.layers.attention.ops import merge_state


def _brute(q, w, keys, q_pos, k_pos, topk, scale):
    """Stable-sort top-k over the visible keys of each query: list of position lists."""
    out = []
    for t in range(q.shape[0]):
        s = index_scores(q[t : t + 1].float(), w[t : t + 1].float(), keys.unsqueeze(0).float(), scale)[0]
        s = s.masked_fill(k_pos > q_pos[t], float("-inf"))
        vals, idx = torch.sort(s, descending=True, stable=True)
        keep = [int(k_pos[i]) for v, i in zip(vals.tolist(), idx.tolist()) if v != float("-inf")]
        out.append(keep[:topk])
    return out


def test_select_topk_equals_stable_sort_with_ties_signed_zeros_and_long_rows():
    """The key-based partial selection picks what a stable descending sort picks: higher score,
    ties (including -0.0 against +0.0) to the lower column, -inf never (index -1)."""
    g = torch.Generator().manual_seed(1)
    for b, total, k in ((5, 37, 9), (3, 5000, 2048), (2, 64, 64)):
        scores = (torch.randn(b, total, generator=g) * 3).round()  # few distinct values: many ties
        scores[0, ::3] = -0.0
        scores[1, total // 2 :] = float("-inf")
        scores[-1, -1] = -1e30
        vals, idx = select_topk(scores, k)
        ref_vals, ref_idx = torch.sort(scores, dim=-1, descending=True, stable=True)
        ref_vals, ref_idx = ref_vals[:, :k], ref_idx[:, :k]
        ref_idx = ref_idx.masked_fill(torch.isinf(ref_vals) & (ref_vals < 0), -1)
        assert torch.equal(idx, ref_idx), (b, total, k)
        assert torch.equal(vals, ref_vals)


def test_merge_candidates_equals_global_selection_with_ties():
    g = torch.Generator().manual_seed(0)
    b, total, k, cp = 6, 40, 7, 3
    scores = torch.randn(b, total, generator=g).round(decimals=1)  # many exact ties
    scores[:, 30:] = float("-inf")  # invisible keys
    scores[0, :] = 0.0  # a row of ties only
    scores[1, 3:] = float("-inf")  # fewer visible keys than k
    expect = select_topk(scores, k)[1]
    owner = torch.arange(total) % cp  # round-robin shards
    vals, poss = [], []
    for r in range(cp):
        cols = torch.nonzero(owner == r).flatten()
        v, i = select_topk(scores[:, cols], k)
        vals.append(v)
        poss.append(torch.where(i >= 0, cols[i.clamp(min=0)], -1))
    got = merge_candidates(torch.cat(vals, 1), torch.cat(poss, 1), k)
    assert torch.equal(got, expect)
    assert sorted(got[1, :3].tolist()) == [0, 1, 2] and got[1, 3:].tolist() == [-1] * (k - 3)
    assert got[0].tolist() == list(range(k))  # ties: earliest positions


def test_own_query_topk_matches_brute_force(monkeypatch):
    monkeypatch.setattr(cp_indexer, "SCORE_BUDGET", 50)  # several query blocks
    g = torch.Generator().manual_seed(1)
    total, heads, dim, topk = 23, 3, 8, 5
    keys = torch.randn(total, dim, generator=g)
    q_pos = torch.tensor([0, 1, 2, 9, 10, 11, 20, 22])  # zigzag-like segments of one rank
    q, w = torch.randn(len(q_pos), heads, dim, generator=g), torch.randn(len(q_pos), heads, generator=g)
    got = own_query_topk(q, w, q_pos, keys, topk, dim**-0.5)
    expect = _brute(q, w, keys, q_pos, torch.arange(total), topk, dim**-0.5)
    for t, e in enumerate(expect):
        assert got[t].tolist() == e + [-1] * (topk - len(e)), t


def test_shard_candidates_merge_to_single_rank_topk():
    g = torch.Generator().manual_seed(2)
    total, heads, dim, topk, cp = 30, 2, 8, 6, 2
    keys = torch.randn(total, dim, generator=g)
    q_pos = torch.tensor([4, 17, 29])
    q, w = torch.randn(3, heads, dim, generator=g), torch.randn(3, heads, generator=g)
    vals, poss = [], []
    for r in range(cp):
        k_pos = torch.nonzero(torch.arange(total) % cp == r).flatten()
        visible = k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)
        v, p = shard_topk_candidates(
            q, w, keys[k_pos].unsqueeze(0), k_pos.unsqueeze(0), visible, topk, dim**-0.5
        )
        vals.append(v)
        poss.append(p)
    got = merge_candidates(torch.cat(vals, 1), torch.cat(poss, 1), topk)
    expect = _brute(q, w, keys, q_pos, torch.arange(total), topk, dim**-0.5)
    for t, e in enumerate(expect):
        assert got[t].tolist() == e + [-1] * (topk - len(e)), t


def test_sparse_attention_partials_merge_to_full():
    g = torch.Generator().manual_seed(3)
    n, heads, dim, v_dim, rows, k = 4, 3, 12, 8, 50, 10
    q, kv = torch.randn(n, heads, dim, generator=g), torch.randn(rows, dim, generator=g)
    slots = torch.stack([torch.randperm(rows, generator=g)[:k] for _ in range(n)])
    valid = torch.ones(n, k, dtype=torch.bool)
    valid[2, 4:] = False
    full = sparse_latent_attention(q, kv, slots, valid, 0.3, v_dim)
    outs, lses = [], []
    for r in range(2):  # split the selected keys by slot parity (two "ranks")
        mine = valid & (slots % 2 == r)
        o, lse = sparse_latent_attention(q, kv, slots, mine, 0.3, v_dim, return_lse=True)
        outs.append(o)
        lses.append(lse)
    merged, _ = merge_state(outs, lses)
    torch.testing.assert_close(merged, full, atol=1e-5, rtol=0)
    none = sparse_latent_attention(q, kv, slots, torch.zeros_like(valid), 0.3, v_dim, return_lse=True)
    assert torch.all(none[0] == 0) and torch.all(torch.isinf(none[1]))
