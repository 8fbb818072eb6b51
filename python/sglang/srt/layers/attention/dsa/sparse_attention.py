"""Selected-token (sparse) attention over latent KV rows, for DeepSeek Sparse Attention.

Every query token attends only to the KV rows the Lightning Indexer selected for it: their slots are
gathered per query ([tokens, topk, dim]) and attended with a per-query softmax, in blocks of queries
so that memory stays bounded by `block * topk * dim`, never by `queries * all keys`.
"""

from __future__ import annotations

from typing import Union

import torch

# Upper bound on gathered elements per block (tokens * topk * kv dim).
GATHER_BUDGET = 1 << 24


def sparse_latent_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    slots: torch.Tensor,
    valid: torch.Tensor,
    scale: float,
    v_dim: int,
    return_lse: bool = False,
    kv_scale: float = 1.0,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Absorbed MQA over selected rows.

    q [n, H, D] (latent query ; roped query), kv [rows, D] the layer's latent cache (value = first
    `v_dim` values of a row), slots [n, K] KV slots chosen for each query, valid [n, K] bool (False:
    padding, e.g. fewer than K visible keys). Returns [n, H, v_dim] in q's dtype; a query with no valid
    key gets zeros. Rows are widened to q's dtype times `kv_scale` (FP8 KV cache). With `return_lse`
    also the log-sum-exp of the scaled scores [n, H] float32 (-inf for a query without valid key),
    for merging partial results over disjoint key sets.
    """
    n, num_heads, dim = q.shape
    k = slots.shape[1]
    out = q.new_zeros((n, num_heads, v_dim))
    lse = (
        torch.full((n, num_heads), float("-inf"), dtype=torch.float32, device=q.device)
        if return_lse
        else None
    )
    if n == 0 or k == 0:
        return (out, lse) if return_lse else out
    block = max(1, GATHER_BUDGET // max(1, k * dim))
    for s in range(0, n, block):
        e = min(n, s + block)
        rows = kv.index_select(0, slots[s:e].reshape(-1)).view(e - s, k, dim).to(q.dtype)  # [b, K, D]
        if kv_scale != 1.0:
            rows = rows * kv_scale
        scores = torch.bmm(q[s:e].float(), rows.float().transpose(1, 2)) * scale  # [b, H, K]
        scores = scores.masked_fill(~valid[s:e].unsqueeze(1), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = torch.nan_to_num(probs, nan=0.0)  # rows with no valid key
        out[s:e] = torch.bmm(probs.to(q.dtype), rows[..., :v_dim])
        if lse is not None:
            lse[s:e] = torch.logsumexp(scores, dim=-1)
    return (out, lse) if return_lse else out
