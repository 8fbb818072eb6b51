"""DeepSeek-V3 / V3.1 (`DeepseekV3ForCausalLM`) and DeepSeek-V3.2 (`DeepseekV32ForCausalLM`).

Wiring only: MLA attention (`layers/attention/mla.py`; V3.2 adds the DSA Lightning Indexer), a dense
SwiGLU MLP for the first `first_k_dense_replace` layers (and layers off the `moe_layer_freq` grid),
and the sparse MoE block elsewhere (`layers/moe/`: sigmoid grouped top-k with
e_score_correction_bias, routed_scaling_factor, shared experts). Pre-norm decoder with the residual
carried through fused RMSNorms, like Llama.

Parallelism: attention heads over `attn_tp` (latent path and indexer replicated), embedding and
dense MLP over `dense_tp_group` (tp without CP), routed experts over `moe_ep` x `moe_tp`, pipeline
stages own [start_layer, end_layer). The KV pool holds compressed latent rows (`create_kv_pool`);
V3.2's also holds the indexer keys. Context parallelism: the model runs on this rank's tokens
(`scatter_model_input`), each rank stores its share of the latent rows / index keys
(`layers/attention/mla_cp.py`), MoE layers gather the batch around the experts
(`GatheredMLPCommunicator`), dense layers stay local.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import ParallelGroups, optional_groups
from sglang.srt.layers.attention.mla import MLAAttention
from sglang.srt.layers.communicator import dense_tp_group, make_layer_communicator, scatter_model_input
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.moe.moe_block import SparseMoeBlock
from sglang.srt.layers.moe.topk import TopKConfig
from sglang.srt.layers.rotary_yarn import DeepseekRotaryEmbedding
from sglang.srt.layers.vocab_embedding import VocabParallelEmbedding
from sglang.srt.mem_cache.kv_pool import KVPool
from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool, MLATokenToKVPool
from sglang.srt.model_executor.forward_batch import ForwardBatch, PPProxyTensors
from sglang.srt.models.causal_lm import CausalLM
from sglang.srt.models.moe_weights import load_moe_weights
from sglang.srt.models.llama import LlamaMLP
from sglang.srt.models.utils import PPMissingLayer, make_layers, pp_layer_range, stage_input, stage_output

_STACKED_MLP: list[tuple[str, str, int]] = [(".gate_proj.", ".gate_up_proj.", 0), (".up_proj.", ".gate_up_proj.", 1)]
Spec = list[tuple[str, tuple[int, ...]]]


def _reject_fp8(name: str) -> None:
    if name.endswith("weight_scale_inv"):
        raise ValueError(f"{name}: FP8 block-quantized checkpoints are not supported; use BF16 weights")


def is_moe_layer(config: Any, layer_id: int) -> bool:
    """MoE or dense MLP: `mlp_layer_types` when the config has it (HF V3.2), else
    n_routed_experts > 0, layer_id >= first_k_dense_replace and layer_id % moe_layer_freq == 0."""
    types = getattr(config, "mlp_layer_types", None)
    if types:
        return types[layer_id] == "sparse"
    if not getattr(config, "n_routed_experts", None):
        return False
    first_dense = getattr(config, "first_k_dense_replace", 0) or 0
    freq = getattr(config, "moe_layer_freq", 1) or 1
    return layer_id >= first_dense and layer_id % freq == 0


def deepseek_topk_config(config: Any) -> TopKConfig:
    return TopKConfig(
        top_k=int(config.num_experts_per_tok),
        scoring_func=getattr(config, "scoring_func", "sigmoid") or "sigmoid",
        renormalize=bool(getattr(config, "norm_topk_prob", True)),
        num_expert_group=getattr(config, "n_group", None),
        topk_group=getattr(config, "topk_group", None),
        routed_scaling_factor=float(getattr(config, "routed_scaling_factor", 1.0) or 1.0),
    )


class DeepseekV2DecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, groups: ParallelGroups, dtype: torch.dtype, use_indexer: bool):
        super().__init__()
        self.layer_id = layer_id
        self.self_attn = MLAAttention(config, layer_id, groups.attn_tp, dtype, use_indexer)
        self.is_moe = is_moe_layer(config, layer_id)
        if self.is_moe:
            moe_inter = int(config.moe_intermediate_size)
            self.mlp: nn.Module = SparseMoeBlock(
                config.hidden_size,
                int(config.n_routed_experts),
                moe_inter,
                deepseek_topk_config(config),
                groups,
                dtype,
                shared_intermediate_size=moe_inter * int(getattr(config, "n_shared_experts", 0) or 0),
                correction_bias=getattr(config, "topk_method", "noaux_tc") == "noaux_tc",
                router_logits_fp32=True,
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
        cos: torch.Tensor,
        sin: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states, residual = self.comm.prepare_attn(hidden_states, residual, forward_batch)
        hidden_states = self.self_attn(hidden_states, cos, sin, forward_batch)
        hidden_states, residual = self.comm.prepare_mlp(hidden_states, residual, forward_batch)
        hidden_states = self.mlp(hidden_states)
        return self.comm.postprocess_layer(hidden_states, residual, forward_batch)


class DeepseekV2Model(nn.Module):
    """Embedding (first stage), decoder layers [start_layer, end_layer), final norm (last stage)."""

    def __init__(self, config: Any, groups: ParallelGroups, dtype: torch.dtype, use_indexer: bool):
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
        self.rotary_emb = DeepseekRotaryEmbedding.from_config(config, int(config.qk_rope_head_dim), dtype)
        self.layers = make_layers(
            n, lambda i: DeepseekV2DecoderLayer(config, i, groups, dtype, use_indexer), self.start_layer, self.end_layer
        )
        self.norm: nn.Module = (
            RMSNorm(config.hidden_size, config.rms_norm_eps, dtype) if self.pp_last else PPMissingLayer()
        )
        self._stage_layers: list[DeepseekV2DecoderLayer] = list(self.layers)[self.start_layer : self.end_layer]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        pp_proxy_tensors: Optional[PPProxyTensors] = None,
    ) -> Union[torch.Tensor, PPProxyTensors]:
        input_ids, positions = scatter_model_input(input_ids, positions, forward_batch)  # CP: local tokens
        hidden_states, residual = stage_input(self, input_ids, pp_proxy_tensors)
        cos, sin = self.rotary_emb.cos_sin(positions)
        for layer in self._stage_layers:
            hidden_states, residual = layer(hidden_states, residual, cos, sin, forward_batch)
        return stage_output(self, hidden_states, residual)


class DeepseekV3ForCausalLM(CausalLM):
    """DeepSeek-V3 / V3.1: dense MLA. `forward` returns logits on the last pipeline stage."""

    use_indexer: bool = False
    supports_context_parallel: bool = True  # sharded latent KV + zero-redundant indexer (mla_cp.py)
    attention_kind = "mla"

    def __init__(self, config: Any, groups: Optional[ParallelGroups] = None, dtype: torch.dtype = torch.float32):
        super().__init__()
        groups = optional_groups(groups)
        if getattr(config, "quantization_config", None):
            raise ValueError("quantized DeepSeek checkpoints (FP8 block scales) are not supported; use BF16 weights")
        self.config = config
        self.groups = groups
        self.dtype = dtype
        self.model = DeepseekV2Model(config, groups, dtype, self.use_indexer)
        self.init_lm_head(config, groups, dtype)

    # ------------------------------------------------------------------ KV pool
    @classmethod
    def kv_cell_size_bytes(cls, config: Any, dtype: torch.dtype, layer_num: Optional[int] = None) -> int:
        """KV bytes per token (latent rows, plus indexer keys for V3.2) over `layer_num` layers."""
        layers = config.num_hidden_layers if layer_num is None else layer_num
        index_dim = int(config.index_head_dim) if cls.use_indexer else 0
        return DSATokenToKVPool.cell_size_bytes(config.kv_lora_rank, config.qk_rope_head_dim, layers, dtype, index_dim)

    def create_kv_pool(
        self, size: int, page_size: int, dtype: torch.dtype, device: Union[str, torch.device] = "cpu"
    ) -> KVPool:
        """The latent KV pool of this pipeline stage's layers (the ModelRunner's pool hook)."""
        cfg, layers = self.config, self.end_layer - self.start_layer
        if self.use_indexer:
            return DSATokenToKVPool(
                size, page_size, dtype, cfg.kv_lora_rank, cfg.qk_rope_head_dim, int(cfg.index_head_dim),
                layers, device, self.start_layer,
            )
        return MLATokenToKVPool(
            size, page_size, dtype, cfg.kv_lora_rank, cfg.qk_rope_head_dim, layers, device, self.start_layer
        )

    # ------------------------------------------------------------------ weights
    @classmethod
    def _attn_specs(cls, config: Any, p: str) -> Spec:
        hidden, heads = config.hidden_size, config.num_attention_heads
        nope, rope, v = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        lat, q_lora = config.kv_lora_rank, getattr(config, "q_lora_rank", None)
        bias = bool(getattr(config, "attention_bias", False))
        a = p + "self_attn."
        specs: Spec = []
        if q_lora:
            specs += [(a + "q_a_proj.weight", (q_lora, hidden)), (a + "q_a_layernorm.weight", (q_lora,))]
            specs += [(a + "q_b_proj.weight", (heads * (nope + rope), q_lora))]
            if bias:
                specs.append((a + "q_a_proj.bias", (q_lora,)))
        else:
            specs.append((a + "q_proj.weight", (heads * (nope + rope), hidden)))
        specs += [(a + "kv_a_proj_with_mqa.weight", (lat + rope, hidden)), (a + "kv_a_layernorm.weight", (lat,))]
        specs += [(a + "kv_b_proj.weight", (heads * (nope + v), lat)), (a + "o_proj.weight", (hidden, heads * v))]
        if bias:
            specs += [(a + "kv_a_proj_with_mqa.bias", (lat + rope,)), (a + "o_proj.bias", (hidden,))]
        if cls.use_indexer:
            ih, idim = int(config.index_n_heads), int(config.index_head_dim)
            i = a + "indexer."
            specs += [(i + "wq_b.weight", (ih * idim, q_lora)), (i + "wk.weight", (idim, hidden))]
            specs += [(i + "k_norm.weight", (idim,)), (i + "k_norm.bias", (idim,))]
            specs.append((i + "weights_proj.weight", (ih, hidden)))
        return specs

    @classmethod
    def dummy_weight_specs(cls, config: Any) -> Spec:
        """HF checkpoint names and FULL shapes of every tensor `load_weights` takes (dummy loading)."""
        hidden, vocab = config.hidden_size, config.vocab_size
        specs: Spec = [("model.embed_tokens.weight", (vocab, hidden))]
        for layer in range(config.num_hidden_layers):
            p = f"model.layers.{layer}."
            specs += [(p + "input_layernorm.weight", (hidden,)), (p + "post_attention_layernorm.weight", (hidden,))]
            specs += cls._attn_specs(config, p)
            m = p + "mlp."
            if is_moe_layer(config, layer):
                experts, inter = int(config.n_routed_experts), int(config.moe_intermediate_size)
                specs.append((m + "gate.weight", (experts, hidden)))
                if getattr(config, "topk_method", "noaux_tc") == "noaux_tc":
                    specs.append((m + "gate.e_score_correction_bias", (experts,)))
                for e in range(experts):
                    specs += [(f"{m}experts.{e}.{proj}.weight", (inter, hidden)) for proj in ("gate_proj", "up_proj")]
                    specs.append((f"{m}experts.{e}.down_proj.weight", (hidden, inter)))
                shared = inter * int(getattr(config, "n_shared_experts", 0) or 0)
                if shared:
                    m = m + "shared_experts."
                else:
                    continue
            else:
                shared = config.intermediate_size
            specs += [(m + "gate_proj.weight", (shared, hidden)), (m + "up_proj.weight", (shared, hidden))]
            specs.append((m + "down_proj.weight", (hidden, shared)))
        specs.append(("model.norm.weight", (hidden,)))
        if not bool(getattr(config, "tie_word_embeddings", False)):
            specs.append(("lm_head.weight", (vocab, hidden)))
        return specs

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors (full, unsharded); returns the names of the parameters filled.

        Layers past num_hidden_layers (the MTP / next-n layers of DeepSeek checkpoints) are skipped."""
        return load_moe_weights(self, weights, _STACKED_MLP, check=_reject_fp8)


class DeepseekV32ForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V3.2: V3 plus DeepSeek Sparse Attention (a Lightning Indexer per layer)."""

    use_indexer = True


EntryClass = [DeepseekV3ForCausalLM, DeepseekV32ForCausalLM]
