"""LogitsProcessor: hidden states of the tokens that need logits -> float32 logits.

With DP attention and an LM head sharded over the whole tp group (not `--enable-dp-lm-head`), the
rows that need logits are gathered from every replica first (`layers/dp_attention.py`: the counts
are `ForwardBatch.dp.num_logit_rows`, or `num_tokens` for all-token logits), the vocab-parallel
logits computed for all of them, and each replica keeps its own rows.

Prompt logprobs (`ForwardBatch.logprob_rows`): the model finishes every row (the batch asks for all
logits) and only the last rows and those rows go through the LM head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

import torch
from torch import nn

from sglang.srt.layers.communicator import cp_gather_logits, cp_logits_split
from sglang.srt.layers.dp_attention import dp_gather, dp_scatter
from sglang.srt.layers.vocab_embedding import ParallelLMHead

if TYPE_CHECKING:
    from sglang.srt.distributed.parallel_state import ParallelGroups
    from sglang.srt.model_executor.forward_batch import ForwardBatch


@dataclass
class LogitsProcessorOutput:
    # [batch_size, vocab] float32: logits of the last new token of each request.
    next_token_logits: torch.Tensor
    # [num_tokens, vocab] float32 for every new token, only when forward_batch.return_all_logits.
    full_logits: Optional[torch.Tensor] = None
    # [len(logprob_rows), vocab] float32: the rows prompt logprobs need (forward_batch.logprob_rows).
    input_logits: Optional[torch.Tensor] = None


class LogitsProcessor(nn.Module):
    """Selects each request's last new token (unless all logits are asked for) and applies the LM head.

    `dp_groups`: set when the LM head is sharded over the ranks of several attention-DP replicas."""

    def __init__(self, vocab_size: int, dp_groups: Optional["ParallelGroups"] = None):
        super().__init__()
        self.vocab_size = vocab_size
        self.dp_groups = dp_groups

    def _logits(self, rows: torch.Tensor, lm_head: ParallelLMHead, fb: "ForwardBatch", counts: Sequence[int]):
        if self.dp_groups is None or fb.dp is None:
            return lm_head.compute_logits(rows).float()
        full = dp_gather(rows, counts, fb.dp.replica, self.dp_groups, partial=False)
        return dp_scatter(lm_head.compute_logits(full).float(), counts, fb.dp.replica)

    def forward(
        self, hidden_states: torch.Tensor, lm_head: ParallelLMHead, forward_batch: "ForwardBatch"
    ) -> LogitsProcessorOutput:
        if cp_logits_split(forward_batch):  # CP: this rank's last tokens only, the logits gathered
            logits = lm_head.compute_logits(hidden_states).float()
            return LogitsProcessorOutput(next_token_logits=cp_gather_logits(logits, forward_batch))
        dp = forward_batch.dp
        if forward_batch.logprob_rows is not None:
            # every row is here (return_all_logits is set with them): each request's last row, then
            # the prompt-logprob rows; under DP the step's counts are these rows (num_logit_rows)
            sel = torch.cat([forward_batch.last_token_indices(), forward_batch.logprob_rows])
            logits = self._logits(hidden_states[sel], lm_head, forward_batch, dp.num_logit_rows if dp else ())
            bs = forward_batch.batch_size
            return LogitsProcessorOutput(next_token_logits=logits[:bs], input_logits=logits[bs:])
        if forward_batch.return_all_logits:
            full = self._logits(hidden_states, lm_head, forward_batch, dp.num_tokens if dp else ())
            if forward_batch.forward_mode.is_decode():
                return LogitsProcessorOutput(next_token_logits=full, full_logits=full)
            return LogitsProcessorOutput(
                next_token_logits=full[forward_batch.last_token_indices()], full_logits=full
            )
        if forward_batch.forward_mode.is_decode() or hidden_states.shape[0] == forward_batch.batch_size:
            last = hidden_states  # one new token per request: already in request order
        else:
            last = hidden_states[forward_batch.last_token_indices()]
        return LogitsProcessorOutput(
            next_token_logits=self._logits(last, lm_head, forward_batch, dp.num_logit_rows if dp else ())
        )
