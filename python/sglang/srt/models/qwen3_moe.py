"""Qwen3-MoE (`Qwen3MoeForCausalLM`): Qwen3 attention (q/k RMSNorm, GQA) + softmax top-k MoE.

Wiring only: the attention block is Llama's (`LlamaAttention` with qk_norm), MLP layers are the
shared `SparseMoeBlock` (softmax routing, `norm_topk_prob`, no shared experts) except layers listed
in `mlp_only_layers` or off the `decoder_sparse_step` grid, which keep a dense SwiGLU MLP.
Parallelism as in llama.py, with routed experts over `moe_ep` x `moe_tp` (the whole tp group).
Context parallelism / DP attention: attention as Llama's, dense layers in their group's layout, MoE
layers on every token the tp group holds (the layer's communicator gathers the normed hidden
states into the replica's or the stage's tokens and keeps its own rows of the output).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.communicator import (
    dense_mlp_tp_group,
    make_layer_communicator,
    moe_mlp_group,
    o_proj_cp_group,
)
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.moe.moe_block import SparseMoeBlock
from sglang.srt.layers.moe.topk import TopKConfig
from sglang.srt.layers.rotary import RotaryEmbedding, get_rope
from sglang.srt.model_executor.forward_batch import ForwardBatch
from sglang.srt.models.causal_lm import CausalLM
from sglang.srt.models.llama import _STACKED_PARAMS, LlamaAttention, LlamaMLP, _head_dim
from sglang.srt.models.stage_model import StageModel


def is_sparse_layer(config: Any, layer_id: int) -> bool:
    """HF rule: not in mlp_only_layers, experts exist, and (layer_id + 1) % decoder_sparse_step == 0."""
    only_mlp = getattr(config, "mlp_only_layers", None) or []
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return (
        layer_id not in only_mlp
        and int(getattr(config, "num_experts", 0) or 0) > 0
        and (layer_id + 1) % step == 0
    )


class Qwen3MoeDecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, groups: ParallelGroups, dtype: torch.dtype):
        super().__init__()
        self.layer_id = layer_id
        bias = bool(getattr(config, "attention_bias", False))
        self.self_attn = LlamaAttention(
            config, layer_id, groups.attn_tp, dtype, bias, False, True, o_proj_cp_group(groups)
        )
        self.is_moe = is_sparse_layer(config, layer_id)
        mlp_group = moe_mlp_group(groups) if self.is_moe else dense_mlp_tp_group(groups)
        if self.is_moe:
            topk = TopKConfig(top_k=int(config.num_experts_per_tok), renormalize=bool(config.norm_topk_prob))
            self.mlp: nn.Module = SparseMoeBlock(
                config.hidden_size,
                int(config.num_experts),
                int(config.moe_intermediate_size),
                topk,
                groups,
                dtype,
                all_to_all=groups.layout.moe_a2a,
            )
        else:
            self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, mlp_group, dtype, False)
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
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states, residual = self.comm.prepare_attn(hidden_states, residual, forward_batch)
        hidden_states = self.self_attn(hidden_states, rotary, cos, sin, forward_batch)
        hidden_states, residual = self.comm.prepare_mlp(hidden_states, residual, forward_batch)
        hidden_states = self.mlp(hidden_states)
        return self.comm.postprocess_layer(hidden_states, residual, forward_batch)


class Qwen3MoeModel(StageModel):
    """Qwen3-MoE decoder stage: `Qwen3MoeDecoderLayer`s with one shared rope (see `StageModel`)."""

    def __init__(self, config: Any, groups: ParallelGroups, dtype: torch.dtype):
        super().__init__(
            config,
            groups,
            dtype,
            get_rope(config, _head_dim(config), dtype),
            lambda i: Qwen3MoeDecoderLayer(config, i, groups, dtype),
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
        for layer in self._stage_layers:
            hidden_states, residual = layer(hidden_states, residual, rotary, cos, sin, forward_batch)
        return hidden_states, residual


class Qwen3MoeForCausalLM(CausalLM):
    """Causal LM head over Qwen3MoeModel; checkpoints load through Llama's stacked-params table."""

    stacked_params = _STACKED_PARAMS
    supports_context_parallel = True  # Llama's CP attention; MoE layers gather the batch

    def build_model(self, config: Any, groups: ParallelGroups, dtype: torch.dtype) -> Qwen3MoeModel:
        return Qwen3MoeModel(config, groups, dtype)


EntryClass = [Qwen3MoeForCausalLM]
