"""Lightning Indexer of DeepSeek Sparse Attention (DeepSeek-V3.2): which past tokens each query attends to.

Per layer: queries from the q-LoRA latent (`wq_b`, `index_n_heads` heads of `index_head_dim`), one
shared key head from the hidden state (`wk` + LayerNorm), non-interleaved ("neox") RoPE on the first
`qk_rope_head_dim` dims of both, a Hadamard rotation (orthogonal, so scores are unchanged in exact
arithmetic; the reference uses it to make FP8 quantisation benign), and per-head weights
`weights_proj(x) * n_heads^-0.5`. The score of query t against key s is

    index_score[t, s] = sum_h relu(q[t, h] · k[s] * head_dim^-0.5) * w[t, h]

masked causally, and each query keeps its `index_topk` best positions (exact ties go to the earlier
position, independent of batch composition; HF's `topk` leaves ties implementation-defined). Keys are stored in the DSA
pool (`set_index_k_buffer`) so later chunks and decode steps score against every cached token.
When no sequence of the batch is longer than `index_topk`, every visible token would be selected:
the selection is then None and the layer runs dense MLA (identical result, no scoring).

The attention backend runs the indexer: a layer hands it one `IndexerInputs` (the indexer and the
activations it projects from), whose keys, queries and key-extended rows are computed on first
use, so a batch that needs no selection never projects queries. `IndexerInputs.select` is the
single-rank form; `cp_indexer.py` holds the context-parallel one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from sglang.srt.layers.attention.dsa.scoring import index_scores, topk_columns
from sglang.srt.layers.attention.ops import causal_mask
from sglang.srt.layers.attention.paged_metadata import PagedMetadata
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.rotary_yarn import DeepseekRotaryEmbedding
from sglang.srt.mem_cache.mla_kv_pool import widen_index_k

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch import ForwardBatch

SCORE_BUDGET = 1 << 24  # max score elements (queries * heads * keys) per block
QUERY_BLOCK = 256  # max queries per block (keys past a block's last query are skipped: ~causal work)


def hadamard_matrix(dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Orthonormal Sylvester Hadamard matrix [dim, dim] (dim a power of two), scaled by dim^-0.5."""
    if dim < 1 or dim & (dim - 1):
        raise ValueError(f"Hadamard rotation needs a power-of-two dim, got {dim}")
    h = torch.ones(1, 1)
    while h.shape[0] < dim:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (h * dim**-0.5).to(dtype)


def index_topk_positions(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_cache: torch.Tensor,
    md: PagedMetadata,
    topk: int,
    softmax_scale: float,
    k_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Top-k key positions per query token: [n, min(topk, longest sequence)] int64, -1 = no key.

    q [n, H, D] indexer queries, weights [n, H] float32 head weights, k_cache [rows, D] the layer's
    index keys (new tokens already written); an FP8 cache (float8_e4m3fn codes) with its block
    scales `k_scale` [rows, blocks] is widened where read (`widen_index_k`)."""

    def read(slots: torch.Tensor) -> torch.Tensor:
        if k_scale is None:
            return k_cache.index_select(0, slots).float()
        return widen_index_k(k_cache.index_select(0, slots), k_scale.index_select(0, slots))

    n = q.shape[0]
    width = min(topk, md.max_seq_len)
    out = torch.full((n, width), -1, dtype=torch.int64, device=q.device)
    if n == 0:
        return out
    qf, wf = q.float(), weights.float()

    if md.single_slots is not None:
        n1, max_len = md.single_slots.shape
        rows = torch.arange(n1, device=q.device) if md.all_single else md.single_token_idx
        k = min(width, max_len)
        block = max(1, SCORE_BUDGET // max(1, (q.shape[1] + k_cache.shape[1]) * max_len))
        for b0 in range(0, n1, block):
            b1 = min(n1, b0 + block)
            keys = read(md.single_slots[b0:b1].reshape(-1)).view(b1 - b0, max_len, -1)
            s = index_scores(qf[rows[b0:b1]], wf[rows[b0:b1]], keys, softmax_scale)
            if md.single_valid is not None:
                s = s.masked_fill(~md.single_valid[b0:b1], float("-inf"))
            out[rows[b0:b1], :k] = topk_columns(s, k)
    for item in md.extends:
        keys = read(item.slots).unsqueeze(0)  # [1, T, D]
        m, seq = item.end - item.start, item.seq_len
        block = max(1, min(QUERY_BLOCK, SCORE_BUDGET // max(1, q.shape[1] * seq)))
        for s0 in range(0, m, block):
            s1 = min(m, s0 + block)
            t0, t1 = item.start + s0, item.start + s1
            upto = item.prefix_len + s1  # keys after the block's last query are invisible to all of it
            s = index_scores(qf[t0:t1], wf[t0:t1], keys[:, :upto], softmax_scale)
            visible = causal_mask(s1 - s0, upto, item.prefix_len + s0, device=q.device)
            k = min(width, upto)
            out[t0:t1, :k] = topk_columns(s.masked_fill(~visible, float("-inf")), k)
    return out


class Indexer(nn.Module):
    """Projections and selection of one layer's Lightning Indexer (replicated on every attention-TP rank,
    so every rank selects the same tokens)."""

    def __init__(
        self,
        hidden_size: int,
        q_lora_rank: int,
        n_heads: int,
        head_dim: int,
        rope_dim: int,
        index_topk: int,
        layer_id: int,
        dtype: torch.dtype,
        use_hadamard: bool = True,
    ):
        super().__init__()
        if rope_dim > head_dim:
            raise ValueError(f"indexer rope dim ({rope_dim}) exceeds index_head_dim ({head_dim})")
        self.n_heads, self.head_dim, self.rope_dim = n_heads, head_dim, rope_dim
        self.index_topk = index_topk
        self.layer_id = layer_id
        self.softmax_scale = head_dim**-0.5
        self.wq_b = ReplicatedLinear(q_lora_rank, n_heads * head_dim, False, None, dtype)
        self.wk = ReplicatedLinear(hidden_size, head_dim, False, None, dtype)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6, dtype=dtype)
        for p in self.k_norm.parameters():
            p.requires_grad_(False)
        # kept in float32 like the reference (its output weighs the heads)
        self.weights_proj = ReplicatedLinear(hidden_size, n_heads, False, None, torch.float32)
        self.use_hadamard = use_hadamard and head_dim & (head_dim - 1) == 0
        if self.use_hadamard:
            self.register_buffer("hadamard", hadamard_matrix(head_dim, dtype), persistent=False)
        # score-work counters (cumulative, this rank): query rows scored, visible (query, key) pairs
        self.score_rows = 0
        self.score_pairs = 0

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [n, heads, head_dim]: neox rope on the first rope_dim dims."""
        r = self.rope_dim
        return torch.cat((DeepseekRotaryEmbedding.apply_neox(x[..., :r], cos, sin), x[..., r:]), dim=-1)

    def project_key(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Index keys [n, head_dim] of new tokens (LayerNorm(wk(x)), rope, Hadamard)."""
        k = self._rope(self.k_norm(self.wk(hidden_states)).unsqueeze(1), cos, sin).squeeze(1)
        return k @ self.hadamard if self.use_hadamard else k

    def project_query(
        self, q_lora: torch.Tensor, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries [n, n_heads, head_dim], head weights [n, n_heads] float32)."""
        n = q_lora.shape[0]
        q = self._rope(self.wq_b(q_lora).view(n, self.n_heads, self.head_dim), cos, sin)
        if self.use_hadamard:
            q = q @ self.hadamard
        return q, self.weights_proj(hidden_states.float()) * self.n_heads**-0.5

    def count(self, rows: int, pairs: int) -> None:
        """Score work done on this rank: query rows scored and visible (query, key) pairs."""
        self.score_rows += int(rows)
        self.score_pairs += int(pairs)

    def reset_counters(self) -> None:
        self.score_rows = self.score_pairs = 0


@dataclass
class IndexerInputs:
    """One layer's Lightning Indexer and what it projects from, handed to the attention backend.

    `q_lora` is filled in by the layer once its q-LoRA latent exists (a context-parallel backend
    already needs the keys before that). Keys, queries and the key-extended latent rows are
    computed on first use and kept, so each is projected at most once per layer call.
    """

    indexer: Indexer
    hidden_states: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    q_lora: Optional[torch.Tensor] = None
    _key: Optional[torch.Tensor] = field(default=None, repr=False)
    _query: Optional[tuple[torch.Tensor, torch.Tensor]] = field(default=None, repr=False)
    _rows: Optional[torch.Tensor] = field(default=None, repr=False)

    def key(self) -> torch.Tensor:
        """Index keys [n, index_head_dim] of the new tokens."""
        if self._key is None:
            self._key = self.indexer.project_key(self.hidden_states, self.cos, self.sin)
        return self._key

    def query(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries [n, n_heads, head_dim], head weights [n, n_heads] float32)."""
        if self._query is None:
            if self.q_lora is None:
                raise RuntimeError("IndexerInputs.query: q_lora was not set by the layer")
            self._query = self.indexer.project_query(self.q_lora, self.hidden_states, self.cos, self.sin)
        return self._query

    def rows_with_key(self, kv_new: torch.Tensor) -> torch.Tensor:
        """The new latent rows [n, L + R] with the index key appended [n, L + R + index_head_dim]
        (what context parallelism moves and stores per token); built once per layer call."""
        if self._rows is None:
            self._rows = torch.cat((kv_new, self.key()), dim=-1)
        return self._rows

    def select(self, forward_batch: "ForwardBatch", md: PagedMetadata) -> Optional[torch.Tensor]:
        """Single-rank selection: store this batch's index keys; return [n, K] selected positions,
        or None for "attend to all" (no sequence longer than index_topk: queries never projected)."""
        idx = self.indexer
        n = self.hidden_states.shape[0]
        k = self.key()
        pool = forward_batch.token_to_kv_pool
        if n:
            pool.set_index_k_buffer(idx.layer_id, forward_batch.out_cache_loc, k)
        if n == 0 or forward_batch.forward_mode.is_idle():
            return None
        if md.max_seq_len <= idx.index_topk:
            return None
        q, weights = self.query()
        pairs = sum(
            e * p + e * (e + 1) // 2
            for e, p in zip(forward_batch.extend_seq_lens_cpu, forward_batch.extend_prefix_lens_cpu)
        )
        idx.count(n, pairs)
        fp8 = pool.get_index_k_fp8(idx.layer_id) if hasattr(pool, "get_index_k_fp8") else None
        keys, scale = fp8 if fp8 is not None else (pool.get_index_k_buffer(idx.layer_id), None)
        return index_topk_positions(q, weights, keys, md, idx.index_topk, idx.softmax_scale, scale)
