"""The chunked-prefill + greedy-decode loop shared by the model parity drivers.

Prompts are fed `chunk` tokens per step; a prompt whose last chunk was fed decodes alongside the
others from the next step on, until every request has `new_tokens` greedy tokens.
`GreedyStepper` is the loop one step at a time (for drivers that must interleave other work, e.g.
the attention-DP replicas, which agree on every step's token counts first).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

Step = Callable[[list[tuple[object, list[int]]]], torch.Tensor]


class GreedyStepper:
    """`next_items()` -> this step's [(req, token ids)] ([] when every request is done);
    `feed(logits)` with that step's next-token logits [len(items), vocab]."""

    def __init__(self, reqs: Sequence[object], prompts: Sequence[list[int]], new_tokens: int, chunk: int):
        self.reqs, self.prompts, self.new_tokens, self.chunk = list(reqs), list(prompts), new_tokens, chunk
        self.fed = [0] * len(prompts)  # prompt tokens already fed
        self.outputs: list[list[int]] = [[] for _ in prompts]
        self.step_logits: list[torch.Tensor] = []
        self._items: list[tuple[object, list[int]]] = []
        self._owners: list[int] = []

    @property
    def done(self) -> bool:
        return all(len(o) >= self.new_tokens for o in self.outputs)

    def next_items(self) -> list[tuple[object, list[int]]]:
        self._items, self._owners = [], []
        for i, (req, prompt) in enumerate(zip(self.reqs, self.prompts)):
            if self.fed[i] < len(prompt):
                self._items.append((req, prompt[self.fed[i] : self.fed[i] + self.chunk]))
            elif len(self.outputs[i]) < self.new_tokens:
                self._items.append((req, [self.outputs[i][-1]]))
            else:
                continue
            self._owners.append(i)
        return self._items

    def feed(self, logits: torch.Tensor) -> None:
        self.step_logits.append(logits.clone())
        for row, i in enumerate(self._owners):
            if self.fed[i] < len(self.prompts[i]):
                self.fed[i] += len(self._items[row][1])
                if self.fed[i] < len(self.prompts[i]):
                    continue
            self.outputs[i].append(int(logits[row].argmax()))


def chunked_greedy(
    step: Step, reqs: Sequence[object], prompts: Sequence[list[int]], new_tokens: int, chunk: int
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """step(items) -> next-token logits [len(items), vocab] for items [(req, token ids)].

    Returns (greedy tokens per request, a clone of every step's logits)."""
    stepper = GreedyStepper(reqs, prompts, new_tokens, chunk)
    while not stepper.done:
        stepper.feed(step(stepper.next_items()))
    return stepper.outputs, stepper.step_logits
