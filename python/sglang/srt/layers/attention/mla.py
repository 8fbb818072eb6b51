"""Multi-head Latent Attention (DeepSeek V2/V3/V3.2) with weight absorption, optionally sparse (DSA).

Projections (TP over `attn_tp`: heads split; the latent path is replicated):
  q:  q_a_proj -> q_a_layernorm -> q_b_proj   (or a plain q_proj when q_lora_rank is None)
      per head [q_nope (qk_nope_head_dim) ; q_rope (qk_rope_head_dim)]
  kv: kv_a_proj_with_mqa -> [latent (kv_lora_rank) ; k_rope (qk_rope_head_dim, one shared head)],
      kv_a_layernorm on the latent; kv_b_proj holds per head [W_UK (nope x L) ; W_UV (v x L)].
Absorbed attention (prefill and decode alike): q_latent = q_nope · W_UK, scores against the cached
rows [latent ; k_rope], output o_latent = softmax · latent, then o = o_latent · W_UV^T and o_proj.
Keys and values are never up-projected per head and the pool holds only the latent rows. With a
Lightning Indexer (V3.2) each query attends to its top-k selected rows only.

The attention itself (storing the rows, the indexer's selection, context parallelism) is the
batch's backend's `forward_mla`; the layer hands it the indexer's inputs as one `IndexerInputs`
and calls the backend's early-exchange hook (`start_mla_exchange`) as soon as the new rows exist,
so that a context-parallel backend can move them while the q up-projection runs.

Rope: MLA rotates interleaved pairs (`rope_interleave`, default True); the softmax scale is
qk_head_dim^-0.5 with the YaRN mscale correction (`rotary_yarn.mla_softmax_scale`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import GroupCoordinator
from sglang.srt.layers.attention.dsa.indexer import Indexer, IndexerInputs
from sglang.srt.layers.context_parallel import get_cp_layout
from sglang.srt.layers.cp_dense_tp import head_sharded_o_proj
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from sglang.srt.layers.rotary_yarn import DeepseekRotaryEmbedding, mla_softmax_scale

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch import ForwardBatch

# DeepSeek's q/kv LoRA norms use a fixed eps (not config.rms_norm_eps).
LORA_NORM_EPS = 1e-6


class MLACore(nn.Module):
    """The attention op of one MLA layer (what RadixAttention is for MHA): sizes, scale, global layer id.

    Runs on the batch's backend (`AttentionBackend.forward_mla`)."""

    def __init__(
        self, num_heads: int, kv_lora_rank: int, qk_rope_head_dim: int, scaling: float, layer_id: int
    ):
        super().__init__()
        self.num_heads = num_heads
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.head_dim = kv_lora_rank + qk_rope_head_dim
        self.v_head_dim = kv_lora_rank
        self.scaling = scaling
        self.layer_id = layer_id

    def start_row_exchange(
        self, kv_new: torch.Tensor, forward_batch: "ForwardBatch", indexer: Optional[IndexerInputs] = None
    ) -> None:
        """Let the backend start moving this layer's new rows early (context parallelism: an async
        all-gather overlapping the query projections); a no-op for backends that do not need it."""
        forward_batch.attn_backend.start_mla_exchange(kv_new, self, forward_batch, indexer)

    def forward(
        self,
        q: torch.Tensor,
        kv_new: torch.Tensor,
        forward_batch: "ForwardBatch",
        indexer: Optional[IndexerInputs] = None,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """q [n, H, L + R], kv_new [n, L + R] -> [n, H, L]; `indexer` for DSA."""
        return forward_batch.attn_backend.forward_mla(q, kv_new, self, forward_batch, indexer, save_kv_cache)

    def extra_repr(self) -> str:
        return f"layer_id={self.layer_id}, heads={self.num_heads}, latent={self.kv_lora_rank}+{self.qk_rope_head_dim}"


class MLAAttention(nn.Module):
    """One MLA self-attention block (projections + absorbed attention [+ indexer] + o_proj)."""

    def __init__(
        self,
        config: Any,
        layer_id: int,
        tp: GroupCoordinator,
        dtype: torch.dtype,
        use_indexer: bool = False,
        o_proj_cp: Optional[GroupCoordinator] = None,
    ):
        """o_proj_cp: the cp group o_proj is row-parallel over (`--enable-cp-dense-tp`), else None."""
        super().__init__()
        hidden = config.hidden_size
        total_heads = config.num_attention_heads
        self.q_lora_rank: Optional[int] = getattr(config, "q_lora_rank", None)
        self.kv_lora_rank = int(config.kv_lora_rank)
        self.qk_nope_head_dim = int(config.qk_nope_head_dim)
        self.qk_rope_head_dim = int(config.qk_rope_head_dim)
        self.v_head_dim = int(config.v_head_dim)
        qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        bias = bool(getattr(config, "attention_bias", False))
        self.rope_interleave = bool(getattr(config, "rope_interleave", True))
        if self.q_lora_rank:
            self.q_a_proj = ReplicatedLinear(hidden, self.q_lora_rank, bias, None, dtype)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LORA_NORM_EPS, dtype)
            self.q_b_proj = ColumnParallelLinear(
                self.q_lora_rank, total_heads * qk_head_dim, False, tp, dtype
            )
        else:
            self.q_proj = ColumnParallelLinear(hidden, total_heads * qk_head_dim, False, tp, dtype)
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            hidden, self.kv_lora_rank + self.qk_rope_head_dim, bias, None, dtype
        )
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LORA_NORM_EPS, dtype)
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_lora_rank, total_heads * (self.qk_nope_head_dim + self.v_head_dim), False, tp, dtype
        )
        # unreduced: the layer's communicator completes the sum over attn_tp (with the DP gather, if any)
        self.o_proj = RowParallelLinear(
            total_heads * self.v_head_dim, hidden, bias, o_proj_cp or tp, dtype, reduce_results=False
        )
        self.o_proj_over_cp = o_proj_cp is not None  # complete rows back (layers/cp_dense_tp.py)
        self.num_heads = total_heads // (tp.size if tp is not None else 1)
        self.attn = MLACore(
            self.num_heads,
            self.kv_lora_rank,
            self.qk_rope_head_dim,
            mla_softmax_scale(qk_head_dim, config),
            layer_id,
        )
        # Shard Linear (layers/shard_linear.py): set by the model when q_b_proj / o_proj are sharded over cp
        self.shard_linear: Optional[Any] = None
        self.indexer: Optional[Indexer] = None
        if use_indexer:
            if not self.q_lora_rank:
                raise ValueError(
                    "the DSA indexer needs q_lora_rank (its queries come from the q-LoRA latent)"
                )
            self.indexer = Indexer(
                hidden,
                self.q_lora_rank,
                int(config.index_n_heads),
                int(config.index_head_dim),
                self.qk_rope_head_dim,
                int(config.index_topk),
                layer_id,
                dtype,
            )

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.rope_interleave:
            return DeepseekRotaryEmbedding.apply_interleaved(x, cos, sin)
        return DeepseekRotaryEmbedding.apply_neox(x, cos, sin)

    def forward(
        self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, forward_batch: "ForwardBatch"
    ) -> torch.Tensor:
        n, heads = hidden_states.shape[0], self.num_heads
        # this layer's q_b_proj / o_proj from their owner rank; next layer's starts
        if self.shard_linear is not None:
            self.shard_linear.acquire(self.attn.layer_id)
        # kv first: the backend may start moving its rows (context parallelism: an async
        # all-gather, with the index keys for DSA) while the q up-projection below runs
        latent, k_rope = self.kv_a_proj_with_mqa(hidden_states).split(
            [self.kv_lora_rank, self.qk_rope_head_dim], -1
        )
        latent = self.kv_a_layernorm(latent)
        k_rope = self._rope(k_rope.unsqueeze(1), cos, sin).squeeze(1)
        kv_new = torch.cat((latent, k_rope), dim=-1)
        dsa = None if self.indexer is None else IndexerInputs(self.indexer, hidden_states, cos, sin)
        self.attn.start_row_exchange(kv_new, forward_batch, dsa)

        q_lora = None
        if self.q_lora_rank:
            q_lora = self.q_a_layernorm(self.q_a_proj(hidden_states))
            q = self.q_b_proj(q_lora)
        else:
            q = self.q_proj(hidden_states)
        q = q.view(n, heads, self.qk_nope_head_dim + self.qk_rope_head_dim)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_rope = self._rope(q_rope, cos, sin)
        w_kv = self.kv_b_proj.weight.view(heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        w_uk, w_uv = w_kv[:, : self.qk_nope_head_dim], w_kv[:, self.qk_nope_head_dim :]
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [n, H, L]
        q_full = torch.cat((q_latent, q_rope), dim=-1)
        if dsa is not None:
            dsa.q_lora = q_lora  # the indexer's queries come from the q-LoRA latent (projected if needed)
        o_latent = self.attn(q_full, kv_new, forward_batch, dsa)  # [n, H, L]
        out = torch.bmm(o_latent.transpose(0, 1), w_uv.transpose(1, 2))  # [H, n, v]
        out = out.transpose(0, 1).reshape(n, heads * self.v_head_dim)
        if self.o_proj_over_cp:
            out = head_sharded_o_proj(out, self.o_proj, get_cp_layout(forward_batch))
        else:
            out = self.o_proj(out)
        if self.shard_linear is not None:
            self.shard_linear.release(self.attn.layer_id)
        return out
