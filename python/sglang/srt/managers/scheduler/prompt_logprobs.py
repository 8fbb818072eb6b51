"""Prompt logprobs of one request (`logprob_start_len` >= 0 with `return_logprob`), as upstream
SGLang returns them: entry i is `(logprob of prompt[start + i] given the tokens before it,
prompt[start + i])`, the first prompt token's logprob None (nothing predicts it).

The logits at position p predict token p + 1, so the entries still missing come from the rows
`[next - 1, n - 1)` of the prompt, wherever the steps that run them fall: a chunked prefill collects
them chunk by chunk, and the radix cache may seed at most `next - 1` tokens while entries are
missing (`max_prefix`), so a cached prefix is recomputed rather than skipped. An entry arrives at
most once: a re-prefill after retraction, or a pipelined step scheduled before the previous one's
result came back, only adds the entries still missing (`add`).

Each step's rows for the model runner: `ScheduleBatch.to_worker_batch`; a step's result applied
to its requests: `logprob_step.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

Pair = tuple[float, int]


@dataclass
class PromptLogprobs:
    """The prompt entries of one request collected so far."""

    start: int  # first prompt position with an entry (logprob_start_len, clamped to the prompt)
    prompt: list[int]
    top_num: int = 0
    token_ids: Optional[list[int]] = None  # token_ids_logprob: these ids' logprobs at every position
    token_logprobs: list[tuple[Optional[float], int]] = field(default_factory=list)
    top_logprobs: list[Optional[list[Pair]]] = field(default_factory=list)
    token_ids_logprobs: list[Optional[list[Pair]]] = field(default_factory=list)
    sent: bool = False  # reported to the detokenizer (once, when complete)

    @classmethod
    def create(
        cls, prompt: list[int], start: int, top_num: int, token_ids: Optional[list[int]]
    ) -> "PromptLogprobs":
        state = cls(
            start=min(max(start, 0), len(prompt)), prompt=prompt, top_num=top_num, token_ids=token_ids
        )
        if state.start == 0 and prompt:  # nothing predicts the first token
            state.token_logprobs.append((None, prompt[0]))
            state.top_logprobs.append(None)
            state.token_ids_logprobs.append(None)
        return state

    @property
    def next_token(self) -> int:
        """Prompt position of the next missing entry."""
        return self.start + len(self.token_logprobs)

    @property
    def done(self) -> bool:
        return self.next_token >= len(self.prompt)

    def max_prefix(self) -> Optional[int]:
        """Most tokens the radix cache may seed while entries are missing (None: no limit)."""
        return None if self.done else max(self.next_token - 1, 0)

    def rows(self, start: int, num_tokens: int) -> tuple[int, int]:
        """(first position, count) of the rows among positions [start, start + num_tokens) whose
        logits give missing entries."""
        if self.done:
            return start, 0
        first = max(start, self.next_token - 1)
        return first, max(0, min(start + num_tokens, len(self.prompt) - 1) - first)

    def add(self, first_pos: int, values: list[float], tops: list, ids: list) -> None:
        """The entries the rows from `first_pos` on gave (row j predicts prompt[first_pos + 1 + j])."""
        for j, value in enumerate(values):
            t = first_pos + 1 + j
            if t != self.next_token:  # already collected (a re-prefill) or not contiguous
                continue
            self.token_logprobs.append((value, self.prompt[t]))
            self.top_logprobs.append(tops[j] if self.top_num else None)
            self.token_ids_logprobs.append(ids[j] if self.token_ids is not None else None)
