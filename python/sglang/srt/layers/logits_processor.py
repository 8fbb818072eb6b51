"""LogitsProcessor: hidden states of the tokens that need logits -> float32 logits.

With DP attention and an LM head sharded over the whole tp group (not `--enable-dp-lm-head`), the
rows that need logits are gathered from every replica first (`layers/dp_attention.py`: the counts
are `ForwardBatch.dp.num_logit_rows`, or `num_tokens` for all-token logits), the vocab-parallel
logits computed for all of them, and each replica keeps its own rows.

Prompt logprobs (`ForwardBatch.logprob_rows`): the model finishes every row (the batch asks for all
logits) and only the last rows and those rows go through the LM head.

Under CP with split decodes (`cp_logits_split`) each rank computes the logits of the last tokens it
holds only and returns them as they are (`CPLocalLogits`); the engine samples them on this rank and
all-gathers the sampled ids (`layers/sampler_cp.py`), never the vocab-wide rows. With the LM head
vocab-sharded over the cp group (`--enable-cp-dense-tp`) each rank computes its vocab slice of
every split row and the slices are moved to the rows' holders (`layers/cp_dense_tp.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

import torch
from torch import nn

from sglang.srt.layers.communicator import cp_gather_logits, cp_logits_split
from sglang.srt.layers.context_parallel import CPLayout, get_cp_layout
from sglang.srt.layers.cp_dense_tp import sharded_local_logits
from sglang.srt.layers.dp_attention import dp_gather, dp_scatter
from sglang.srt.layers.vocab_embedding import ParallelLMHead

if TYPE_CHECKING:
    from sglang.srt.distributed.parallel_state import ParallelGroups
    from sglang.srt.model_executor.forward_batch import ForwardBatch


@dataclass
class CPLocalLogits:
    """Under a split CP decode (`cp_logits_split`): the logits of the last tokens this cp rank holds,
    its split ones in request order, then those every rank holds (`CPLayout.replicated_last_tokens`).
    The engine samples them where they are (`layers/sampler_cp.py`)."""

    logits: torch.Tensor  # [rows, vocab] float32
    layout: CPLayout

    def gather(self) -> torch.Tensor:
        """[batch_size, vocab] on every rank (a collective: every cp rank calls it or none does)."""
        return cp_gather_logits(self.logits, self.layout)


class LogitsProcessorOutput:
    """`next_token_logits`: [batch_size, vocab] float32, the logits of each request's last new token;
    `full_logits`: [num_tokens, vocab] for every new token (only when forward_batch.return_all_logits);
    `input_logits`: [len(logprob_rows), vocab], the rows prompt logprobs need; `cp_local`: this rank's
    rows under a split CP decode, from which `next_token_logits` is all-gathered on first read (a
    collective: read it on every cp rank or on none; the engine samples `cp_local` instead)."""

    def __init__(
        self,
        next_token_logits: Optional[torch.Tensor] = None,
        full_logits: Optional[torch.Tensor] = None,
        input_logits: Optional[torch.Tensor] = None,
        cp_local: Optional[CPLocalLogits] = None,
    ):
        self._next_token_logits = next_token_logits
        self.full_logits, self.input_logits, self.cp_local = full_logits, input_logits, cp_local

    @property
    def next_token_logits(self) -> torch.Tensor:
        if self._next_token_logits is None and self.cp_local is not None:
            self._next_token_logits = self.cp_local.gather()
        return self._next_token_logits


class LogitsProcessor(nn.Module):
    """Selects each request's last new token (unless all logits are asked for) and applies the LM head.

    `dp_groups`: set when the LM head is sharded over the ranks of several attention-DP replicas;
    `cp_sharded`: the LM head is vocab-sharded over the cp group (`--enable-cp-dense-tp`)."""

    def __init__(
        self, vocab_size: int, dp_groups: Optional["ParallelGroups"] = None, cp_sharded: bool = False
    ):
        super().__init__()
        self.vocab_size = vocab_size
        self.dp_groups = dp_groups
        self.cp_sharded = cp_sharded

    def _logits(self, rows: torch.Tensor, lm_head: ParallelLMHead, fb: "ForwardBatch", counts: Sequence[int]):
        if self.dp_groups is None or fb.dp is None:
            return lm_head.compute_logits(rows).float()
        full = dp_gather(rows, counts, fb.dp.replica, self.dp_groups, partial=False)
        return dp_scatter(lm_head.compute_logits(full).float(), counts, fb.dp.replica)

    def forward(
        self, hidden_states: torch.Tensor, lm_head: ParallelLMHead, forward_batch: "ForwardBatch"
    ) -> LogitsProcessorOutput:
        if cp_logits_split(forward_batch):  # CP: this rank's last tokens only, sampled here
            cp = get_cp_layout(forward_batch)
            cp.count("logit_rows", hidden_states.shape[0])
            if self.cp_sharded:  # every rank a vocab slice of every split row (cp_dense_tp.py)
                logits = sharded_local_logits(hidden_states, lm_head, cp).float()
            else:
                logits = lm_head.compute_logits(hidden_states).float()
            return LogitsProcessorOutput(cp_local=CPLocalLogits(logits, cp))
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
