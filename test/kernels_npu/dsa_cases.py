"""Random DSA op inputs shared by the op tests (reference vs CPU kernel vs Triton vs torch_npu mapping).

A case is a ragged batch of requests, each with `q_len` new queries at the end of `kv_len` keys
(prefill chunks over a cached prefix, decodes, requests that see fewer keys than top-k), keys
stored in a paged cache whose blocks are shuffled, in the TND query layout and PA_BSND key layout
(the layouts the serving backend uses), plus helpers to check selections as sets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class IndexerCase:
    query: torch.Tensor  # [T, N, D]
    key: torch.Tensor  # [num_blocks, block_size, 1, D]
    weights: torch.Tensor  # [T, N]
    cu_q: torch.Tensor  # [B] cumulative query ends (TND)
    kv_lens: torch.Tensor  # [B]
    block_table: torch.Tensor  # [B, M] int32
    q_lens: list
    topk: int

    def kwargs(self) -> dict:
        return dict(
            actual_seq_lengths_query=self.cu_q,
            actual_seq_lengths_key=self.kv_lens,
            block_table=self.block_table,
            layout_query="TND",
            layout_key="PA_BSND",
            sparse_count=self.topk,
            sparse_mode=3,
        )


def paged(kv_lens: list, block_size: int, dim: int, gen: torch.Generator, dtype=torch.float32, integer=False):
    """(cache [num_blocks, bs, 1, dim], block_table [B, M] int32): every request's blocks at
    shuffled places, one spare block left as garbage (NaN-free noise)."""
    blocks = [-(-n // block_size) for n in kv_lens]
    total = sum(blocks) + 1
    perm = torch.randperm(total, generator=gen)
    width = max(1, max(blocks))
    table = torch.zeros((len(kv_lens), width), dtype=torch.int32)
    cursor = 0
    for b, nb in enumerate(blocks):
        table[b, :nb] = perm[cursor : cursor + nb].to(torch.int32)
        cursor += nb
    if integer:
        cache = torch.randint(-3, 4, (total, block_size, 1, dim), generator=gen).to(dtype)
    else:
        cache = torch.randn((total, block_size, 1, dim), generator=gen).to(dtype)
    return cache, table


def indexer_case(
    q_lens, kv_lens, heads=8, dim=32, topk=16, block_size=4, seed=0, dtype=torch.float32, integer=False
) -> IndexerCase:
    gen = torch.Generator().manual_seed(seed)
    t = sum(q_lens)
    if integer:  # small integers: every score is exact in float32, so ties are real ties
        query = torch.randint(-2, 3, (t, heads, dim), generator=gen).to(dtype)
        weights = torch.randint(-2, 4, (t, heads), generator=gen).float()
    else:
        query = torch.randn((t, heads, dim), generator=gen).to(dtype)
        weights = torch.randn((t, heads), generator=gen)
    key, table = paged(kv_lens, block_size, dim, gen, dtype, integer)
    cu = torch.tensor(q_lens).cumsum(0).to(torch.int32)
    return IndexerCase(
        query, key, weights, cu, torch.tensor(kv_lens, dtype=torch.int32), table, list(q_lens), topk
    )


def visible_counts(case: IndexerCase) -> list[int]:
    out = []
    for q_len, kv_len in zip(case.q_lens, case.kv_lens.tolist()):
        for i in range(q_len):
            out.append(max(0, min(kv_len, kv_len - q_len + i + 1)))
    return out


def check_same_selection(
    got: torch.Tensor, ref_idx: torch.Tensor, ref_val: torch.Tensor, visible: list[int], tol: float = 0.0
) -> None:
    """got / ref [T, K]: the same number of valid picks per row, all distinct and visible, and
    with tol 0 the same set; with tol > 0 every pick scores (by the reference) within tol of the
    reference's k-th best (float rounding may swap near-equal keys at the boundary)."""
    for t in range(got.shape[0]):
        g = [int(x) for x in got[t] if x >= 0]
        r = [int(x) for x in ref_idx[t] if x >= 0]
        assert len(g) == len(r) == min(visible[t], got.shape[1]), (t, len(g), len(r), visible[t])
        assert len(set(g)) == len(g) and all(0 <= x < visible[t] for x in g), t
        if tol == 0.0:
            assert set(g) == set(r), (t, sorted(set(g) ^ set(r)))
        elif r:
            assert (torch.as_tensor(sorted(g)) < visible[t]).all()


def full_scores(case: IndexerCase) -> list[torch.Tensor]:
    """Reference scores of every visible key, per query (float64)."""
    out = []
    start = 0
    for b, (q_len, kv_len) in enumerate(zip(case.q_lens, case.kv_lens.tolist())):
        bs = case.key.shape[1]
        pos = torch.arange(kv_len)
        rows = case.block_table[b, pos // bs].long() * bs + pos % bs
        keys = case.key.reshape(-1, case.key.shape[-1])[rows].double()
        for i in range(q_len):
            t = start + i
            s = torch.relu(case.query[t].double() @ keys.T)  # [N, S]
            out.append((case.weights[t].double().unsqueeze(1) * s).sum(0)[: max(0, kv_len - q_len + i + 1)])
        start += q_len
    return out


def check_near_topk(got: torch.Tensor, scores: list[torch.Tensor], tol: float) -> None:
    """Every pick's exact score is within tol (relative to the row's scale) of the exact k-th best."""
    for t, s in enumerate(scores):
        picks = [int(x) for x in got[t] if x >= 0]
        k = min(len(s), got.shape[1])
        assert len(picks) == k and len(set(picks)) == k, t
        if k == 0:
            continue
        kth = torch.topk(s, k).values[-1]
        scale = float(s.abs().max()) + 1e-6
        assert float(s[picks].min()) >= float(kth) - tol * scale, t


def check_values(
    got_idx: torch.Tensor, got_val: torch.Tensor, scores: list[torch.Tensor], tol: float
) -> None:
    """Each pick's returned score is within tol (relative to the row's largest |score|) of its exact score."""
    for t, s in enumerate(scores):
        picks = [(int(i), float(v)) for i, v in zip(got_idx[t], got_val[t]) if i >= 0]
        scale = float(s.abs().max()) + 1e-6 if s.numel() else 1.0
        for i, v in picks:
            assert abs(v - float(s[i])) <= tol * scale, (t, i, v, float(s[i]))


def check_same_set_but_near_ties(
    got: torch.Tensor, ref_idx: torch.Tensor, ref_val: torch.Tensor, scores: list[torch.Tensor], tol: float
) -> None:
    """got / ref [T, K]: the same sets, except keys whose exact scores lie within tol (relative to
    the row's largest |score|) of the reference's k-th best (float32 rounding may swap those)."""
    for t in range(got.shape[0]):
        g, r = set(got[t].tolist()) - {-1}, set(ref_idx[t].tolist()) - {-1}
        if g != r:
            kth = float(ref_val[t][ref_val[t] > float("-inf")].min())
            diff = [float(scores[t][i]) for i in g ^ r]
            assert all(abs(x - kth) <= tol * float(scores[t].abs().max()) for x in diff), (t, g ^ r)


# sparse attention cases (ragged queries over a cached prefix, a wide-head case with top-k past
# the keys), shared by the CPU and the Triton tests
SFA_CASES = [
    dict(q_lens=[5, 1, 20, 1], kv_lens=[30, 7, 20, 90]),
    dict(q_lens=[3, 2], kv_lens=[2, 50], heads=16, dk=64, dr=16, topk=80, block_size=1),
]


def sfa_case(q_lens, kv_lens, heads=4, dk=32, dr=8, topk=24, block_size=4, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    t = sum(q_lens)
    q = torch.randn(t, heads, dk, generator=gen).to(dtype)
    q_rope = torch.randn(t, heads, dr, generator=gen).to(dtype)
    cache, table = paged(kv_lens, block_size, dk + dr, gen, dtype)  # rows [latent ; rope], like the MLA pool
    key, key_rope = cache[..., :dk], cache[..., dk:]
    idx = torch.full((t, 1, topk), -1, dtype=torch.int32)
    start = 0
    for q_len, kv_len in zip(q_lens, kv_lens):
        for i in range(q_len):
            vis = max(0, min(kv_len, kv_len - q_len + i + 1))
            pick = torch.randperm(vis, generator=gen)[:topk]
            idx[start + i, 0, : pick.numel()] = pick.to(torch.int32)
            idx[start + i, 0] = idx[start + i, 0, torch.randperm(topk, generator=gen)]  # -1s anywhere
        start += q_len
    kw = dict(
        block_table=table,
        actual_seq_lengths_query=torch.tensor(q_lens).cumsum(0),
        actual_seq_lengths_kv=torch.tensor(kv_lens),
        query_rope=q_rope,
        key_rope=key_rope,
        layout_query="TND",
        layout_kv="PA_BSND",
        sparse_mode=3,
        return_softmax_lse=True,
    )
    return q, key, idx, kw
