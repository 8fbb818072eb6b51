"""StageModel: the part of a decoder-only model that one pipeline stage runs.

Embedding on the first stage, decoder layers [start_layer, end_layer) of the model (placeholders
for the other stages' layers, so `layers[i]` is global layer i and checkpoint names line up), the
final norm on the last stage. Parameter names: `embed_tokens.weight`, `layers.N.*`, `norm.weight`
(`model.` in front once a CausalLM holds it).

`forward` is the same for every model: this rank's tokens under context parallelism, the stage's
input (embedding or the previous stage's `PPProxyTensors`), rope cos/sin of the positions, the
layers, the stage's output (`PPProxyTensors` for the next stage, or the final-normed hidden
states). A model provides the layer factory, the rotary embedding and `forward_layers` (how its
layers are called).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.communicator import embedding_tp_group, scatter_model_input
from sglang.srt.layers.context_parallel import get_cp_layout
from sglang.srt.layers.cp_dense_tp import embed_to_local_rows
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.vocab_embedding import VocabParallelEmbedding
from sglang.srt.model_executor.forward_batch import ForwardBatch, PPProxyTensors
from sglang.srt.models.utils import PPMissingLayer, make_layers, pp_layer_range

HiddenAndResidual = tuple[torch.Tensor, Optional[torch.Tensor]]


class StageModel(nn.Module):
    """Embedding (first stage), decoder layers [start_layer, end_layer), final norm (last stage).

    `rotary_emb` must have `cos_sin(positions) -> (cos, sin)`; `layer_fn(i)` builds global layer i
    (called for this stage's layers only). Subclasses implement `forward_layers`."""

    def __init__(
        self,
        config: Any,
        groups: ParallelGroups,
        dtype: torch.dtype,
        rotary_emb: nn.Module,
        layer_fn: Callable[[int], nn.Module],
    ):
        super().__init__()
        self.config = config
        self.pp_first, self.pp_last = groups.pp.is_first, groups.pp.is_last
        n = config.num_hidden_layers
        self.start_layer, self.end_layer = pp_layer_range(n, groups.pp.rank, groups.pp.size)
        if self.pp_first:
            self.embed_tokens: nn.Module = VocabParallelEmbedding(
                config.vocab_size, config.hidden_size, embedding_tp_group(groups), dtype
            )
        else:
            self.embed_tokens = PPMissingLayer()
        # `--enable-cp-dense-tp`: the table is sharded over ranks holding different tokens, so the
        # batch's ids are embedded before the CP split (`layers/cp_dense_tp.py`)
        self.embed_before_split = self.pp_first and groups.layout.cp_dense_tp
        self.rotary_emb = rotary_emb
        self.layers = make_layers(n, layer_fn, self.start_layer, self.end_layer)
        if self.pp_last:
            self.norm: nn.Module = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        else:
            self.norm = PPMissingLayer()
        # plain list for the hot loop (ModuleList indexing is slower); modules stay registered above
        self._stage_layers: list[nn.Module] = list(self.layers)[self.start_layer : self.end_layer]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        pp_proxy_tensors: Optional[PPProxyTensors] = None,
    ) -> Union[torch.Tensor, PPProxyTensors]:
        cp = get_cp_layout(forward_batch) if self.embed_before_split else None
        if cp is not None:
            hidden_states, residual = embed_to_local_rows(self.embed_tokens, input_ids, cp), None
        input_ids, positions = scatter_model_input(input_ids, positions, forward_batch)  # CP: local tokens
        if cp is None:
            hidden_states, residual = self.stage_input(input_ids, pp_proxy_tensors)
        cos, sin = self.rotary_emb.cos_sin(positions)
        hidden_states, residual = self.forward_layers(hidden_states, residual, cos, sin, forward_batch)
        return self.stage_output(hidden_states, residual)

    def forward_layers(
        self,
        hidden_states: torch.Tensor,
        residual: Optional[torch.Tensor],
        cos: torch.Tensor,
        sin: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> HiddenAndResidual:
        """Run `self._stage_layers` in order; returns (hidden_states, residual) after the last."""
        raise NotImplementedError

    def stage_input(
        self, input_ids: torch.Tensor, pp_proxy_tensors: Optional[PPProxyTensors]
    ) -> HiddenAndResidual:
        """(hidden_states, residual) entering this stage's layers: the embedding on the first
        stage, the previous stage's `PPProxyTensors` elsewhere."""
        if self.pp_first:
            return self.embed_tokens(input_ids), None
        if pp_proxy_tensors is None:
            raise ValueError("a non-first pipeline stage needs pp_proxy_tensors")
        return pp_proxy_tensors["hidden_states"], pp_proxy_tensors["residual"]

    def stage_output(
        self, hidden_states: torch.Tensor, residual: Optional[torch.Tensor]
    ) -> Union[torch.Tensor, PPProxyTensors]:
        """What leaves this stage: proxies for the next stage, or the final-normed hidden states."""
        if not self.pp_last:
            return PPProxyTensors({"hidden_states": hidden_states, "residual": residual})
        if residual is None:  # a stage without layers
            return self.norm(hidden_states)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states
