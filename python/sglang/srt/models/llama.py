"""Llama-family decoder-only models: Llama / SmolLM, Qwen2 (qkv bias), Qwen3 (q/k RMSNorm).

Wiring only: every block is a shared layer. Tensor parallelism: attention projections are sharded
over `groups.attn_tp`, the MLP over `dense_mlp_tp_group(groups)`, the embedding and LM head over
their groups (`layers/communicator.py`: `groups.tp` without context parallelism or DP attention).
Context parallelism / DP attention: the model runs on this rank's token shard; the layer's
`LayerCommunicator` completes the attention output (o_proj leaves its sum to it) and moves tokens
to the MLP's layout and back; the attention backend exchanges K/V across the cp ranks. Pipeline parallelism: `LlamaModel` is a
`StageModel` (`model.layers` indexed by global layer id, this stage's layers [start_layer,
end_layer), placeholders elsewhere). Checkpoint loading and the checkpoint layout come from
`CausalLM` and `_STACKED_PARAMS`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from transformers import PretrainedConfig

from sglang.srt.distributed.parallel_state import GroupCoordinator, ParallelGroups
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.attention.radix_attention import RadixAttention
from sglang.srt.layers.communicator import dense_mlp_tp_group, make_layer_communicator, o_proj_cp_group
from sglang.srt.layers.context_parallel import get_cp_layout, is_cp_batch
from sglang.srt.layers.cp_dense_tp import head_sharded_o_proj
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.rotary import RotaryEmbedding, get_rope
from sglang.srt.model_executor.forward_batch import ForwardBatch
from sglang.srt.models.causal_lm import CausalLM
from sglang.srt.models.checkpoint_specs import StackedParam
from sglang.srt.models.stage_model import StageModel

# checkpoint name piece -> (fused parameter piece, shard id)
_STACKED_PARAMS: list[StackedParam] = [
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", 0),
    (".up_proj.", ".gate_up_proj.", 1),
]


def _head_dim(config: PretrainedConfig) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


class LlamaMLP(nn.Module):
    def __init__(
        self, hidden_size: int, intermediate_size: int, tp: GroupCoordinator, dtype: torch.dtype, bias: bool
    ):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias, tp, dtype)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, tp, dtype)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gated = self.gate_up_proj.fused_swiglu(x)
        if gated is None:
            gated = self.act_fn(self.gate_up_proj(x))
        return self.down_proj(gated)


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        tp: GroupCoordinator,
        dtype: torch.dtype,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm: bool,
        o_proj_cp: Optional[GroupCoordinator] = None,
    ):
        """o_proj_cp: the cp group o_proj is row-parallel over (`--enable-cp-dense-tp`), else None."""
        super().__init__()
        head_dim = _head_dim(config)
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, head_dim, num_heads, num_kv_heads, qkv_bias, tp, dtype
        )
        # unreduced: the layer's communicator completes the sum over attn_tp (with the DP gather, if any)
        self.o_proj = RowParallelLinear(
            num_heads * head_dim, config.hidden_size, o_bias, o_proj_cp or tp, dtype, reduce_results=False
        )
        self.o_proj_over_cp = o_proj_cp is not None  # complete rows back (layers/cp_dense_tp.py)
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.q_size = self.qkv_proj.q_size
        self.kv_size = self.qkv_proj.kv_size
        if qk_norm:
            self.q_norm: Optional[RMSNorm] = RMSNorm(head_dim, config.rms_norm_eps, dtype)
            self.k_norm: Optional[RMSNorm] = RMSNorm(head_dim, config.rms_norm_eps, dtype)
        else:
            self.q_norm = self.k_norm = None
        self.attn = RadixAttention(self.num_heads, head_dim, head_dim**-0.5, self.num_kv_heads, layer_id)

    def forward(
        self,
        hidden_states: torch.Tensor,
        rotary: RotaryEmbedding,
        cos: torch.Tensor,
        sin: torch.Tensor,
        forward_batch: ForwardBatch,
        keep_rows: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """keep_rows: only these rows of the attention output go through o_proj (the last layer,
        when only each request's last token needs logits; K / V of every token are still cached)."""
        qkv = self.qkv_proj(hidden_states)
        n, qk_size = qkv.shape[0], self.q_size + self.kv_size
        v = qkv[:, qk_size:]
        if self.q_norm is None and not is_cp_batch(forward_batch):
            # rotate q and k together: one set of rope ops per layer
            qk = rotary.apply(
                qkv[:, :qk_size].view(n, self.num_heads + self.num_kv_heads, self.head_dim), cos, sin
            )
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        else:
            q = qkv[:, : self.q_size].view(n, self.num_heads, self.head_dim)
            k = qkv[:, self.q_size : qk_size].view(n, self.num_kv_heads, self.head_dim)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            k = rotary.apply(k, cos, sin)
            self.attn.start_kv_exchange(k, v, forward_batch)  # CP: k/v all-gather overlaps q's rope
            q = rotary.apply(q, cos, sin)
        out = self.attn(q, k, v, forward_batch)
        if keep_rows is not None:
            out = out[keep_rows]
        if self.o_proj_over_cp:
            return head_sharded_o_proj(out, self.o_proj, get_cp_layout(forward_batch))
        return self.o_proj(out)


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        layer_id: int,
        groups: ParallelGroups,
        dtype: torch.dtype,
        qkv_bias: bool,
        qk_norm: bool,
    ):
        super().__init__()
        self.layer_id = layer_id
        o_bias = bool(getattr(config, "attention_bias", False))
        self.self_attn = LlamaAttention(
            config, layer_id, groups.attn_tp, dtype, qkv_bias, o_bias, qk_norm, o_proj_cp_group(groups)
        )
        mlp_bias = bool(getattr(config, "mlp_bias", False))
        mlp_group = dense_mlp_tp_group(groups)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, mlp_group, dtype, mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.comm = make_layer_communicator(
            mlp_group, self.input_layernorm, self.post_attention_layernorm, groups
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        residual: Optional[torch.Tensor],
        rotary: RotaryEmbedding,
        cos: torch.Tensor,
        sin: torch.Tensor,
        forward_batch: ForwardBatch,
        keep_rows: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states, residual = self.comm.prepare_attn(hidden_states, residual, forward_batch)
        hidden_states = self.self_attn(hidden_states, rotary, cos, sin, forward_batch, keep_rows)
        if keep_rows is not None:  # dense layouts (identity moves): the rows stay put
            residual = residual[keep_rows]
        hidden_states, residual = self.comm.prepare_mlp(hidden_states, residual, forward_batch)
        hidden_states = self.mlp(hidden_states)
        return self.comm.postprocess_layer(hidden_states, residual, forward_batch)


class LlamaModel(StageModel):
    """Llama decoder stage: `LlamaDecoderLayer`s with one shared rope (see `StageModel`). The
    model's last layer finishes only the rows that need logits (`_logit_rows`)."""

    def __init__(
        self,
        config: PretrainedConfig,
        groups: ParallelGroups,
        dtype: torch.dtype,
        qkv_bias: bool,
        qk_norm: bool,
    ):
        super().__init__(
            config,
            groups,
            dtype,
            get_rope(config, _head_dim(config), dtype),
            lambda i: LlamaDecoderLayer(config, i, groups, dtype, qkv_bias, qk_norm),
        )

    def forward_layers(
        self,
        hidden_states: torch.Tensor,
        residual: Optional[torch.Tensor],
        cos: torch.Tensor,
        sin: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        rotary = self.rotary_emb
        layers = self._stage_layers
        for layer in layers[:-1]:
            hidden_states, residual = layer(hidden_states, residual, rotary, cos, sin, forward_batch)
        if layers:
            keep = self._logit_rows(forward_batch, hidden_states.shape[0])
            hidden_states, residual = layers[-1](
                hidden_states, residual, rotary, cos, sin, forward_batch, keep
            )
        return hidden_states, residual

    def _logit_rows(self, forward_batch: ForwardBatch, num_tokens: int) -> Optional[torch.Tensor]:
        """Rows the model's last layer must finish past attention: each request's last new token,
        when that is all the logits processor takes (no all-token logits, no CP token shards, no DP
        attention step, whose MLP may gather every replica's rows by the step's token counts, the
        model's final layer is on this stage); None when every row is needed. The last layer then
        skips o_proj, the MLP and the norms for the other rows."""
        if not self.pp_last or forward_batch.return_all_logits or is_cp_batch(forward_batch):
            return None
        if forward_batch.dp is not None:
            return None
        if forward_batch.batch_size == num_tokens:  # decode: one row per request already
            return None
        return forward_batch.last_token_indices()


class LlamaForCausalLM(CausalLM):
    """Causal LM head over LlamaModel. `forward` returns logits on the last pipeline stage and
    `PPProxyTensors` on the others."""

    stacked_params = _STACKED_PARAMS
    force_qkv_bias: bool = False
    use_qk_norm: bool = False
    supports_context_parallel = True  # token layout via layers/communicator.py

    def build_model(self, config: PretrainedConfig, groups: ParallelGroups, dtype: torch.dtype) -> LlamaModel:
        qkv_bias = self.force_qkv_bias or bool(getattr(config, "attention_bias", False))
        return LlamaModel(config, groups, dtype, qkv_bias, self.use_qk_norm)


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2: Llama with biases on q/k/v (not on o_proj)."""

    force_qkv_bias = True


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: Llama with a per-head RMSNorm on q and k before rope; head_dim comes from the config."""

    use_qk_norm = True


EntryClass = [LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM]
