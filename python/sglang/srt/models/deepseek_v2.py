"""DeepSeek-V3 / V3.1 (`DeepseekV3ForCausalLM`) and DeepSeek-V3.2 (`DeepseekV32ForCausalLM`).

Wiring only: MLA attention (`layers/attention/mla.py`; V3.2 adds the DSA Lightning Indexer), a dense
SwiGLU MLP for the first `first_k_dense_replace` layers (and layers off the `moe_layer_freq` grid),
and the sparse MoE block elsewhere (`layers/moe/`: sigmoid grouped top-k with
e_score_correction_bias, routed_scaling_factor, shared experts). Pre-norm decoder with the residual
carried through fused RMSNorms, like Llama.

Parallelism: attention heads over `attn_tp` (latent path and indexer replicated), dense MLPs over
`dense_mlp_tp_group`, routed experts over `moe_ep` x `moe_tp` (the whole tp group), pipeline stages
own [start_layer, end_layer). The KV pool holds compressed latent rows (`create_kv_pool`); V3.2's
also holds the indexer keys. Context parallelism: the model runs on this rank's tokens
(`scatter_model_input`), each rank stores its share of the latent rows / index keys (the attention
backend's sharded CP; decodes are dealt over the cp ranks too). With CP or DP attention the
layer's communicator gathers, around an MLP sharded over the tp group, every token that group
holds, and keeps this rank's rows after it; under CP with whole experts per rank (ep = tp) the MoE
instead routes this rank's own tokens and moves them by the EP all-to-all
(`ep_all_to_all.moe_all_to_all`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.attention.dsa.backend_names import int8_index_keys
from sglang.srt.layers.attention.mla import MLAAttention
from sglang.srt.layers.communicator import (
    dense_mlp_tp_group,
    make_layer_communicator,
    moe_mlp_group,
    o_proj_cp_group,
)
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.quantization.config import quant_spec_from_config
from sglang.srt.layers.moe.moe_block import SparseMoeBlock
from sglang.srt.layers.moe.topk import TopKConfig
from sglang.srt.layers.rotary_yarn import DeepseekRotaryEmbedding
from sglang.srt.mem_cache.kv_pool import KVPool
from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool, MLATokenToKVPool
from sglang.srt.model_executor.forward_batch import ForwardBatch
from sglang.srt.models.causal_lm import CausalLM
from sglang.srt.models.checkpoint_specs import StackedParam
from sglang.srt.models.llama import LlamaMLP
from sglang.srt.models.stage_model import StageModel

if TYPE_CHECKING:
    from sglang.srt.layers.shard_linear import ShardLinearSeries

# checkpoint name piece -> (fused parameter piece, shard id): dense and shared-expert MLPs
_STACKED_MLP: list[StackedParam] = [(".gate_proj.", ".gate_up_proj.", 0), (".up_proj.", ".gate_up_proj.", 1)]


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
    def __init__(
        self, config: Any, layer_id: int, groups: ParallelGroups, dtype: torch.dtype, use_indexer: bool
    ):
        super().__init__()
        self.layer_id = layer_id
        self.self_attn = MLAAttention(
            config, layer_id, groups.attn_tp, dtype, use_indexer, o_proj_cp_group(groups)
        )
        self.is_moe = is_moe_layer(config, layer_id)
        mlp_group = moe_mlp_group(groups) if self.is_moe else dense_mlp_tp_group(groups)
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
        cos: torch.Tensor,
        sin: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states, residual = self.comm.prepare_attn(hidden_states, residual, forward_batch)
        hidden_states = self.self_attn(hidden_states, cos, sin, forward_batch)
        hidden_states, residual = self.comm.prepare_mlp(hidden_states, residual, forward_batch)
        hidden_states = self.mlp(hidden_states)
        return self.comm.postprocess_layer(hidden_states, residual, forward_batch)


class DeepseekV2Model(StageModel):
    """DeepSeek decoder stage: `DeepseekV2DecoderLayer`s with one shared YaRN rope (see `StageModel`)."""

    def __init__(self, config: Any, groups: ParallelGroups, dtype: torch.dtype, use_indexer: bool):
        super().__init__(
            config,
            groups,
            dtype,
            DeepseekRotaryEmbedding.from_config(config, int(config.qk_rope_head_dim), dtype),
            lambda i: DeepseekV2DecoderLayer(config, i, groups, dtype, use_indexer),
        )

    def forward_layers(
        self,
        hidden_states: torch.Tensor,
        residual: Optional[torch.Tensor],
        cos: torch.Tensor,
        sin: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        for layer in self._stage_layers:
            hidden_states, residual = layer(hidden_states, residual, cos, sin, forward_batch)
        return hidden_states, residual


class DeepseekV3ForCausalLM(CausalLM):
    """DeepSeek-V3 / V3.1: dense MLA. `forward` returns logits on the last pipeline stage."""

    stacked_params = _STACKED_MLP
    use_indexer: bool = False
    supports_context_parallel = True  # sharded latent KV + zero-redundant indexer (mla_cp.py)
    attention_kind = "mla"

    # FP8 checkpoints (layers/quantization): kv_b_proj is read as a tensor (absorbed), so widened at load
    fp8_unquantized_modules = ("kv_b_proj",)

    def __init__(
        self, config: Any, groups: Optional[ParallelGroups] = None, dtype: torch.dtype = torch.float32
    ):
        quant_spec_from_config(config)  # an unsupported quantization_config refused before any weight
        super().__init__(config, groups, dtype)

    def build_model(self, config: Any, groups: ParallelGroups, dtype: torch.dtype) -> DeepseekV2Model:
        return DeepseekV2Model(config, groups, dtype, self.use_indexer)

    # ------------------------------------------------------------------ KV pool
    def kv_cell_size_bytes(self, dtype: torch.dtype, kv_dtype: Optional[torch.dtype] = None) -> int:
        """KV bytes per token slot: latent rows (plus indexer keys for V3.2) of this stage's layers."""
        cfg, layers = self.config, self.end_layer - self.start_layer
        index_dim = int(cfg.index_head_dim) if self.use_indexer else 0
        return DSATokenToKVPool.cell_size_bytes(
            cfg.kv_lora_rank, cfg.qk_rope_head_dim, layers, dtype, index_dim, int8_index_keys(), kv_dtype
        )

    def create_kv_pool(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        device: Union[str, torch.device] = "cpu",
        kv_dtype: Optional[torch.dtype] = None,
    ) -> KVPool:
        """The latent KV pool of this pipeline stage's layers (the ModelRunner's pool hook)."""
        cfg, layers = self.config, self.end_layer - self.start_layer
        if self.use_indexer:
            return DSATokenToKVPool(
                size,
                page_size,
                dtype,
                cfg.kv_lora_rank,
                cfg.qk_rope_head_dim,
                int(cfg.index_head_dim),
                layers,
                device,
                self.start_layer,
                int8_index_keys(),
                kv_dtype,
            )
        return MLATokenToKVPool(
            size,
            page_size,
            dtype,
            cfg.kv_lora_rank,
            cfg.qk_rope_head_dim,
            layers,
            device,
            self.start_layer,
            kv_dtype,
        )

    # ------------------------------------------------------------------ Shard Linear
    def enable_shard_linear(self) -> Optional["ShardLinearSeries"]:
        """Shard Linear (`--enable-shard-linear`, layers/shard_linear.py): after loading, keep each
        layer's q_b_proj / o_proj weights only on cp rank layer_id % cp; they are broadcast before
        use. Needs attn_tp = 1. Returns the series (None at cp = 1: nothing to share)."""
        from sglang.srt.layers.shard_linear import ShardLinearSeries

        cp = self.groups.attn_cp
        if cp.size == 1:
            return None
        if self.groups.attn_tp.size != 1:
            raise ValueError(
                "--enable-shard-linear needs attention TP 1 (tp = cp): cp ranks must hold equal weights"
            )
        layers = []
        for layer in self.model._stage_layers:
            attn = layer.self_attn
            if not getattr(attn, "q_lora_rank", None):
                raise ValueError(
                    "--enable-shard-linear shards q_b_proj, which this model (no q-LoRA) does not have"
                )
            if any(m.weight.element_size() == 1 for m in (attn.q_b_proj, attn.o_proj)):
                raise ValueError(
                    "--enable-shard-linear is not supported with quantized (fp8 / w8a8_int8) "
                    "q_b_proj / o_proj weights yet"
                )
            layers.append((layer.layer_id, {"q_b_proj": attn.q_b_proj, "o_proj": attn.o_proj}))
        series = ShardLinearSeries(cp, layers)
        series.activate()
        for layer in self.model._stage_layers:
            layer.self_attn.shard_linear = series
        self.shard_linear_series = series
        return series


class DeepseekV32ForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V3.2: V3 plus DeepSeek Sparse Attention (a Lightning Indexer per layer)."""

    use_indexer = True


EntryClass = [DeepseekV3ForCausalLM, DeepseekV32ForCausalLM]
