"""LogitsProcessor: hidden states of the tokens that need logits -> float32 logits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from sglang.srt.layers.vocab_embedding import ParallelLMHead

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch import ForwardBatch


@dataclass
class LogitsProcessorOutput:
    # [batch_size, vocab] float32: logits of the last new token of each request.
    next_token_logits: torch.Tensor
    # [num_tokens, vocab] float32 for every new token, only when forward_batch.return_all_logits.
    full_logits: Optional[torch.Tensor] = None


class LogitsProcessor(nn.Module):
    """Selects each request's last new token (unless all logits are asked for) and applies the LM head."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(
        self, hidden_states: torch.Tensor, lm_head: ParallelLMHead, forward_batch: "ForwardBatch"
    ) -> LogitsProcessorOutput:
        if forward_batch.return_all_logits:
            full = lm_head.compute_logits(hidden_states).float()
            if forward_batch.forward_mode.is_decode():
                return LogitsProcessorOutput(next_token_logits=full, full_logits=full)
            return LogitsProcessorOutput(next_token_logits=full[forward_batch.last_token_indices()], full_logits=full)
        if forward_batch.forward_mode.is_decode() or hidden_states.shape[0] == forward_batch.batch_size:
            last = hidden_states  # one new token per request: already in request order
        else:
            last = hidden_states[forward_batch.last_token_indices()]
        return LogitsProcessorOutput(next_token_logits=lm_head.compute_logits(last).float())
