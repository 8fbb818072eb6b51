"""The chunked-prefill + greedy-decode loop shared by the model parity drivers.

Prompts are fed `chunk` tokens per step; a prompt whose last chunk was fed decodes alongside the
others from the next step on, until every request has `new_tokens` greedy tokens.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

Step = Callable[[list[tuple[object, list[int]]]], torch.Tensor]


def chunked_greedy(
    step: Step, reqs: Sequence[object], prompts: Sequence[list[int]], new_tokens: int, chunk: int
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """step(items) -> next-token logits [len(items), vocab] for items [(req, token ids)].

    Returns (greedy tokens per request, a clone of every step's logits)."""
    fed = [0] * len(prompts)  # prompt tokens already fed
    outputs: list[list[int]] = [[] for _ in prompts]
    step_logits: list[torch.Tensor] = []
    while any(len(o) < new_tokens for o in outputs):
        items, owners = [], []
        for i, (req, prompt) in enumerate(zip(reqs, prompts)):
            if fed[i] < len(prompt):
                items.append((req, prompt[fed[i] : fed[i] + chunk]))
            elif len(outputs[i]) < new_tokens:
                items.append((req, [outputs[i][-1]]))
            else:
                continue
            owners.append(i)
        logits = step(items)
        step_logits.append(logits.clone())
        for row, i in enumerate(owners):
            if fed[i] < len(prompts[i]):
                fed[i] += len(items[row][1])
                if fed[i] < len(prompts[i]):
                    continue
            outputs[i].append(int(logits[row].argmax()))
    return outputs, step_logits
