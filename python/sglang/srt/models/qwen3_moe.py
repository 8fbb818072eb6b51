"""Qwen3-MoE (`Qwen3MoeForCausalLM`): Qwen3 attention (q/k RMSNorm, GQA) + softmax top-k MoE.

Wiring only: the attention block is Llama's (`LlamaAttention` with qk_norm), MLP layers are the
shared `SparseMoeBlock` (softmax routing, `norm_topk_prob`, no shared experts) except layers listed
in `mlp_only_layers` or off the `decoder_sparse_step` grid, which keep a dense SwiGLU MLP.
Parallelism as in llama.py, with routed experts over `moe_ep` x `moe_tp`. Context parallelism:
attention as Llama's (sharded KV, k/v all-gather), dense layers on this rank's tokens, MoE layers
on the whole batch (`GatheredMLPCommunicator`: gather the normed hidden states, keep own rows).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import ParallelGroups, optional_groups
from sglang.srt.layers.communicator import dense_tp_group, make_layer_communicator, scatter_model_input
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.moe.moe_block import SparseMoeBlock
from sglang.srt.layers.moe.topk import TopKConfig
from sglang.srt.layers.rotary import RotaryEmbedding, get_rope
from sglang.srt.layers.vocab_embedding import VocabParallelEmbedding
from sglang.srt.model_executor.forward_batch import ForwardBatch, PPProxyTensors
from sglang.srt.models.causal_lm import CausalLM
from sglang.srt.models.moe_weights import load_moe_weights
from sglang.srt.models.llama import _STACKED_PARAMS, LlamaAttention, LlamaMLP, _head_dim
from sglang.srt.models.utils import PPMissingLayer, make_layers, pp_layer_range, stage_input, stage_output

Spec = list[tuple[str, tuple[int, ...]]]


def is_sparse_layer(config: Any, layer_id: int) -> bool:
    """HF rule: not in mlp_only_layers, experts exist, and (layer_id + 1) % decoder_sparse_step == 0."""
    only_mlp = getattr(config, "mlp_only_layers", None) or []
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return layer_id not in only_mlp and int(getattr(config, "num_experts", 0) or 0) > 0 and (layer_id + 1) % step == 0


class Qwen3MoeDecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, groups: ParallelGroups, dtype: torch.dtype):
        super().__init__()
        self.layer_id = layer_id
        bias = bool(getattr(config, "attention_bias", False))
        self.self_attn = LlamaAttention(config, layer_id, groups.attn_tp, dtype, bias, False, True)
        self.is_moe = is_sparse_layer(config, layer_id)
        if self.is_moe:
            topk = TopKConfig(top_k=int(config.num_experts_per_tok), renormalize=bool(config.norm_topk_prob))
            self.mlp: nn.Module = SparseMoeBlock(
                config.hidden_size, int(config.num_experts), int(config.moe_intermediate_size), topk, groups, dtype
            )
        else:
            self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, dense_tp_group(groups), dtype, False)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.comm = make_layer_communicator(self.is_moe, self.input_layernorm, self.post_attention_layernorm, groups)

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


class Qwen3MoeModel(nn.Module):
    def __init__(self, config: Any, groups: ParallelGroups, dtype: torch.dtype):
        super().__init__()
        self.config = config
        self.pp_first, self.pp_last = groups.pp.is_first, groups.pp.is_last
        n = config.num_hidden_layers
        self.start_layer, self.end_layer = pp_layer_range(n, groups.pp.rank, groups.pp.size)
        if self.pp_first:
            self.embed_tokens: nn.Module = VocabParallelEmbedding(
                config.vocab_size, config.hidden_size, dense_tp_group(groups), dtype
            )
        else:
            self.embed_tokens = PPMissingLayer()
        self.rotary_emb = get_rope(config, _head_dim(config), dtype)
        self.layers = make_layers(
            n, lambda i: Qwen3MoeDecoderLayer(config, i, groups, dtype), self.start_layer, self.end_layer
        )
        self.norm: nn.Module = (
            RMSNorm(config.hidden_size, config.rms_norm_eps, dtype) if self.pp_last else PPMissingLayer()
        )
        self._stage_layers: list[Qwen3MoeDecoderLayer] = list(self.layers)[self.start_layer : self.end_layer]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        pp_proxy_tensors: Optional[PPProxyTensors] = None,
    ) -> Union[torch.Tensor, PPProxyTensors]:
        input_ids, positions = scatter_model_input(input_ids, positions, forward_batch)  # CP: local tokens
        hidden_states, residual = stage_input(self, input_ids, pp_proxy_tensors)
        rotary = self.rotary_emb
        cos, sin = rotary.cos_sin(positions)
        for layer in self._stage_layers:
            hidden_states, residual = layer(hidden_states, residual, rotary, cos, sin, forward_batch)
        return stage_output(self, hidden_states, residual)


class Qwen3MoeForCausalLM(CausalLM):
    stacked_params = _STACKED_PARAMS
    supports_context_parallel: bool = True  # Llama's CP attention; MoE layers gather the batch

    def __init__(self, config: Any, groups: Optional[ParallelGroups] = None, dtype: torch.dtype = torch.float32):
        super().__init__()
        groups = optional_groups(groups)
        self.config = config
        self.groups = groups
        self.dtype = dtype
        self.model = Qwen3MoeModel(config, groups, dtype)
        self.init_lm_head(config, groups, dtype)

    @classmethod
    def dummy_weight_specs(cls, config: Any) -> Spec:
        """HF checkpoint names and FULL shapes of every tensor `load_weights` takes (dummy loading)."""
        hidden, vocab, head_dim = config.hidden_size, config.vocab_size, _head_dim(config)
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        bias = bool(getattr(config, "attention_bias", False))
        specs: Spec = [("model.embed_tokens.weight", (vocab, hidden))]
        for layer in range(config.num_hidden_layers):
            p = f"model.layers.{layer}."
            specs += [(p + "input_layernorm.weight", (hidden,)), (p + "post_attention_layernorm.weight", (hidden,))]
            q_out, kv_out = heads * head_dim, kv_heads * head_dim
            for proj, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
                specs.append((f"{p}self_attn.{proj}.weight", (out, hidden)))
                if bias:
                    specs.append((f"{p}self_attn.{proj}.bias", (out,)))
            specs.append((p + "self_attn.o_proj.weight", (hidden, heads * head_dim)))
            specs += [(p + "self_attn.q_norm.weight", (head_dim,)), (p + "self_attn.k_norm.weight", (head_dim,))]
            if is_sparse_layer(config, layer):
                experts, inter = int(config.num_experts), int(config.moe_intermediate_size)
                specs.append((p + "mlp.gate.weight", (experts, hidden)))
                for e in range(experts):
                    q = f"{p}mlp.experts.{e}."
                    specs += [(q + "gate_proj.weight", (inter, hidden)), (q + "up_proj.weight", (inter, hidden))]
                    specs.append((q + "down_proj.weight", (hidden, inter)))
            else:
                inter = config.intermediate_size
                specs += [(p + "mlp.gate_proj.weight", (inter, hidden)), (p + "mlp.up_proj.weight", (inter, hidden))]
                specs.append((p + "mlp.down_proj.weight", (hidden, inter)))
        specs.append(("model.norm.weight", (hidden,)))
        if not bool(getattr(config, "tie_word_embeddings", False)):
            specs.append(("lm_head.weight", (vocab, hidden)))
        return specs

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors (full, unsharded); returns the names of the parameters filled."""
        return load_moe_weights(self, weights, _STACKED_PARAMS)


EntryClass = [Qwen3MoeForCausalLM]
