"""CausalLM: the part every decoder-only model shares on top of its layer stack.

A stage-aware LM head (tied to the embedding when the config says so and both live on this
stage), logits on the last pipeline stage and `PPProxyTensors` on the others, and the final hidden
states gathered into original token order first under context parallelism.
"""

from __future__ import annotations

from typing import Any, ClassVar, Union

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.communicator import dense_tp_group, gather_for_logits
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.vocab_embedding import ParallelLMHead
from sglang.srt.model_executor.forward_batch import ForwardBatch, PPProxyTensors
from sglang.srt.models.utils import PPMissingLayer


class CausalLM(nn.Module):
    """Base of `*ForCausalLM` classes. Subclasses build `self.model` (with `embed_tokens`,
    `start_layer`, `end_layer` and `forward(input_ids, positions, forward_batch, pp_proxy_tensors)`)
    and then call `init_lm_head`."""

    model: nn.Module
    attention_kind: ClassVar[str] = "mha"  # what its attention layers need from the backend ("mha" / "mla")

    def init_lm_head(self, config: Any, groups: ParallelGroups, dtype: torch.dtype) -> None:
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if groups.pp.is_last:
            self.lm_head: nn.Module = ParallelLMHead(config.vocab_size, config.hidden_size, dense_tp_group(groups), dtype)
            if self.tie_word_embeddings and groups.pp.is_first:
                self.lm_head.tie_to(self.model.embed_tokens)
        else:
            self.lm_head = PPMissingLayer()
        self.logits_processor = LogitsProcessor(config.vocab_size)

    @property
    def start_layer(self) -> int:
        return self.model.start_layer

    @property
    def end_layer(self) -> int:
        return self.model.end_layer

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> Union[LogitsProcessorOutput, PPProxyTensors]:
        out = self.model(input_ids, positions, forward_batch, forward_batch.pp_proxy_tensors)
        if isinstance(out, PPProxyTensors):
            return out
        return self.logits_processor(gather_for_logits(out, forward_batch), self.lm_head, forward_batch)
