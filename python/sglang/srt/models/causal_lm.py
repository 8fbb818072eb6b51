"""CausalLM: the part every decoder-only model shares on top of its pipeline stage (`StageModel`).

A stage-aware LM head (tied to the embedding when the config says so and both live on this
stage), logits on the last pipeline stage and `PPProxyTensors` on the others, and the final hidden
states gathered into original token order first under context parallelism. Also what the model
runner and the loaders ask of every model: the stage's layer range, the KV pool and its bytes per
token (MHA by default), whether context parallelism is supported, the checkpoint layout
(`dummy_weight_specs`, derived from the model) and `load_weights`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable, Optional, Sequence, Union

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import ParallelGroups, optional_groups
from sglang.srt.layers.communicator import gather_for_logits, lm_head_tp_group
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.vocab_embedding import ParallelLMHead
from sglang.srt.mem_cache.kv_pool import KVPool, MHATokenToKVPool
from sglang.srt.model_executor.forward_batch import ForwardBatch, PPProxyTensors
from sglang.srt.models.checkpoint_specs import StackedParam, WeightSpec, derive_weight_specs
from sglang.srt.models.stage_model import StageModel
from sglang.srt.models.utils import PPMissingLayer
from sglang.srt.models.weight_loading import load_checkpoint_weights
from sglang.srt.platforms.kernel_dispatch import kv_store_op


class CausalLM(nn.Module):
    """Base of `*ForCausalLM` classes, built as `cls(config, groups, dtype)`.

    A subclass provides `build_model` (its `StageModel`) and `stacked_params` (checkpoint piece ->
    fused parameter piece, shard id: what `load_weights` and the derived checkpoint layout use);
    it overrides `kv_cell_size_bytes` / `create_kv_pool` when its KV cache is not MHA, and sets
    `supports_context_parallel` when its attention handles a CP token layout."""

    model: StageModel
    stacked_params: ClassVar[Sequence[StackedParam]] = ()
    supports_context_parallel: ClassVar[bool] = False
    attention_kind: ClassVar[str] = "mha"  # what its attention layers need from the backend ("mha" / "mla")

    def __init__(
        self, config: Any, groups: Optional[ParallelGroups] = None, dtype: torch.dtype = torch.float32
    ):
        super().__init__()
        groups = optional_groups(groups)
        self.config = config
        self.groups = groups
        self.dtype = dtype
        self.model = self.build_model(config, groups, dtype)
        self.init_lm_head(config, groups, dtype)

    def build_model(self, config: Any, groups: ParallelGroups, dtype: torch.dtype) -> StageModel:
        """This rank's pipeline stage of the decoder (registered as `self.model`)."""
        raise NotImplementedError

    def init_lm_head(self, config: Any, groups: ParallelGroups, dtype: torch.dtype) -> None:
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        head_group = lm_head_tp_group(groups, self.tie_word_embeddings)
        if groups.pp.is_last:
            self.lm_head: nn.Module = ParallelLMHead(config.vocab_size, config.hidden_size, head_group, dtype)
            if self.tie_word_embeddings and groups.pp.is_first:
                self.lm_head.tie_to(self.model.embed_tokens)
        else:
            self.lm_head = PPMissingLayer()
        # an LM head sharded over ranks of other DP replicas sees every replica's rows
        spans_replicas = groups.layout.attn_dp > 1 and head_group.size > groups.replica.size
        self.logits_processor = LogitsProcessor(
            config.vocab_size, groups if spans_replicas else None, cp_sharded=groups.layout.cp_dense_tp
        )

    @property
    def start_layer(self) -> int:
        """First global layer id of this pipeline stage."""
        return self.model.start_layer

    @property
    def end_layer(self) -> int:
        """One past the last global layer id of this pipeline stage."""
        return self.model.end_layer

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> Union[LogitsProcessorOutput, PPProxyTensors]:
        out = self.model(input_ids, positions, forward_batch, forward_batch.pp_proxy_tensors)
        if isinstance(out, PPProxyTensors):
            return out
        return self.logits_processor(gather_for_logits(out, forward_batch), self.lm_head, forward_batch)

    # ------------------------------------------------------------------ KV pool
    def _mha_kv_heads_and_dim(self) -> tuple[int, int]:
        """(KV heads one attention-tp rank holds, head dim): KV heads are replicated when there are
        fewer than ranks (the same numbers as `ModelConfig.get_num_kv_heads` / `head_dim`)."""
        cfg = self.config
        kv_heads = getattr(cfg, "num_key_value_heads", None)
        kv_heads = int(kv_heads if kv_heads is not None else cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        return max(1, kv_heads // self.groups.attn_tp.size), head_dim

    def kv_cell_size_bytes(self, dtype: torch.dtype, kv_dtype: Optional[torch.dtype] = None) -> int:
        """KV bytes per token slot of `create_kv_pool`'s pool (this stage's layers). Default: MHA."""
        heads, head_dim = self._mha_kv_heads_and_dim()
        layers = self.end_layer - self.start_layer
        return MHATokenToKVPool.cell_size_bytes(heads, head_dim, layers, kv_dtype or dtype)

    def create_kv_pool(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        device: Union[str, torch.device] = "cpu",
        kv_dtype: Optional[torch.dtype] = None,
    ) -> KVPool:
        """The KV pool of this stage's layers, `size` token slots, K/V stored in `kv_dtype` (default
        `dtype`, `--kv-cache-dtype`). Default: MHA K and V per layer."""
        heads, head_dim = self._mha_kv_heads_and_dim()
        return MHATokenToKVPool(
            size,
            page_size,
            dtype,
            heads,
            head_dim,
            self.end_layer - self.start_layer,
            device=device,
            start_layer=self.start_layer,
            kv_dtype=kv_dtype,
            store_rows=kv_store_op(torch.device(device)),
        )

    # ------------------------------------------------------------------ weights
    @classmethod
    def dummy_weight_specs(cls, config: Any) -> list[WeightSpec]:
        """HF checkpoint names and FULL (unsharded) shapes of every tensor `load_weights` takes,
        derived from the model (`checkpoint_specs.py`). The dummy loader draws these tensors and
        feeds them through `load_weights`, so dummy weights do not depend on the tp size or the
        pipeline split."""
        return derive_weight_specs(cls, config, cls.stacked_params)

    def check_checkpoint_tensor(self, name: str) -> None:
        """Raise for a checkpoint tensor this model cannot take (default: take everything)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors (full, unsharded); returns the names of the parameters filled."""
        return load_checkpoint_weights(
            self,
            weights,
            self.stacked_params,
            (self.start_layer, self.end_layer),
            self.tie_word_embeddings,
            self.check_checkpoint_tensor,
        )
