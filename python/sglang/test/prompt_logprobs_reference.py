"""transformers' float32 prompt logprobs on the SmolLM2 weights (the HF directory converted from the
embedded GGUF, `smollm2_reference.cached_hf_dir`), and the checks the prompt-logprob tests share.

`reference(prompt)`: per prompt position t >= 1, log P(prompt[t] | prompt[:t]), the top-k and the
log_softmax rows themselves (for token_ids_logprob); the last row predicts the first output token.
"""

from __future__ import annotations

import functools
import torch

TOL = 2e-3  # prompt logprobs vs transformers, float32

# "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
PROMPT_TEXT = (
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Spain is Madrid. "
    "The capital of Italy is"
)


@functools.lru_cache(maxsize=1)
def smollm2_hf_dir() -> str:
    from sglang.srt.model_loader.default_model import find_default_model
    from sglang.test.smollm2_reference import cached_hf_dir

    return cached_hf_dir(find_default_model())


@functools.lru_cache(maxsize=1)
def _hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        smollm2_hf_dir(), dtype=torch.float32, local_files_only=True, attn_implementation="eager"
    ).eval()


@functools.lru_cache(maxsize=1)
def prompt_ids() -> tuple[int, ...]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_hf_dir(), local_files_only=True)
    return tuple(tok.encode(PROMPT_TEXT))


def reference(prompt: list[int]) -> torch.Tensor:
    """[len(prompt), vocab] float32 log_softmax of transformers' logits (row p predicts token p+1)."""
    with torch.no_grad():
        logits = _hf_model()(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def check_entries(entries: list, prompt: list[int], start: int, ref: torch.Tensor, what: str = "") -> None:
    """`entries` ([logprob, id, ...] per prompt position from `start`) against the reference."""
    assert len(entries) == len(prompt) - start, (what, len(entries))
    for i, entry in enumerate(entries):
        t = start + i
        assert entry[1] == prompt[t], (what, t)
        if t == 0:
            assert entry[0] is None, what
            continue
        want = float(ref[t - 1, prompt[t]])
        assert abs(entry[0] - want) <= TOL, (what, t, entry[0], want)


def check_top(tops: list, start: int, ref: torch.Tensor, k: int, what: str = "") -> None:
    """Per position from `start`, the top-k ids and their logprobs (position 0: None)."""
    for i, top in enumerate(tops):
        t = start + i
        if t == 0:
            assert top is None, what
            continue
        vals, ids = torch.topk(ref[t - 1], k)
        assert [e[1] for e in top][:2] == ids.tolist()[:2], (what, t)  # ties below the top two may swap
        assert max(abs(e[0] - v) for e, v in zip(top, vals.tolist())) <= TOL, (what, t)


def check_token_ids(lists: list, start: int, ref: torch.Tensor, ids: list[int], what: str = "") -> None:
    for i, got in enumerate(lists):
        t = start + i
        if t == 0:
            assert got is None, what
            continue
        assert [e[1] for e in got] == ids, what
        for e in got:
            assert abs(e[0] - float(ref[t - 1, e[1]])) <= TOL, (what, t)


def output_logprob(ref: torch.Tensor) -> tuple[float, int]:
    """The greedy first output token after the whole prompt and its logprob."""
    lp, tid = torch.max(ref[-1], dim=-1)
    return float(lp), int(tid)
