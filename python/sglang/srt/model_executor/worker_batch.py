"""ModelWorkerBatch: what the scheduler hands the model runner for one forward step.

Plain lists, no request objects and no tensors of its own (`out_cache_loc`, the step's KV slots,
comes from the allocator). The scheduler builds one from its `ScheduleBatch`
(`managers/scheduler/schedule_batch.py`, `to_worker_batch`); a later pipeline stage rebuilds one
from the ring's `StageBatch` (`managers/pp/messages.py`), which carries it; `ModelRunner` turns it
into a `ForwardBatch`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from sglang.srt.sampling.sampling_params import SamplingParams


@dataclass
class ModelWorkerBatch:
    """What crosses from the scheduler to the model runner: plain lists, no request objects."""

    input_ids: list[int]
    positions: list[int]
    out_cache_loc: Any  # int64 tensor from the allocator
    req_pool_indices: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    is_decode: bool
    # Rows (indices into the batch's requests) that sample a token this step, and their inputs.
    sample_rows: list[int]
    sampling_params: list[SamplingParams]
    prompt_ids: list[list[int]]
    output_ids: list[list[int]]
    return_logprob: bool
    top_logprobs_nums: list[int]
    # token_ids_logprob of each sampling row (None: not asked)
    token_ids_logprob: list[Optional[list[int]]] = field(default_factory=list)
    # Prompt logprobs (managers/scheduler/prompt_logprobs.py): flat token indices whose logits are
    # needed, the token each predicts, and per row its request's top-k size and token ids.
    logprob_rows: list[int] = field(default_factory=list)
    logprob_targets: list[int] = field(default_factory=list)
    logprob_top_nums: list[int] = field(default_factory=list)
    logprob_token_ids: list[Optional[list[int]]] = field(default_factory=list)
    # constrained decoding: int32 [len(sample_rows), ceil(vocab / 32)] bitmask of allowed tokens
    # (the scheduler's GrammarManager); None when no sampling row is constrained
    vocab_mask: Optional[Any] = None

    @classmethod
    def empty(cls) -> "ModelWorkerBatch":
        """A batch of no requests (an attention-DP replica's IDLE part of a step): the two flags
        False, no vocab mask, every other field an empty list."""
        flags = {"is_decode": False, "return_logprob": False, "vocab_mask": None}
        return cls(**{f.name: flags.get(f.name, []) for f in dataclasses.fields(cls)})

    @property
    def batch_size(self) -> int:
        return len(self.req_pool_indices)

    @property
    def num_logit_rows(self) -> int:
        """Rows that go through the LM head: each request's last token and the prompt-logprob rows."""
        return self.batch_size + len(self.logprob_rows)
