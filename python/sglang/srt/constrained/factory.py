"""The scheduler's `GrammarManager` for `--grammar-backend` (xgrammar or none)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from sglang.srt.constrained.grammar_manager import GrammarManager

BACKENDS = ("xgrammar", "llguidance", "none")


def create_grammar_manager(
    backend: str,
    tokenizer: Any,
    vocab_size: int,
    stop_token_ids: Sequence[int],
    group: Optional[Any] = None,
    jump_forward: bool = False,
    any_whitespace: bool = True,
) -> GrammarManager:
    """`tokenizer` None (`--skip-tokenizer-init`): no vocabulary to compile against, so none.
    `jump_forward`: `--enable-jump-forward`; `any_whitespace`: False with
    `--constrained-json-disable-any-whitespace` (JSON without free whitespace)."""
    if backend == "none":
        return GrammarManager(None, group)
    if tokenizer is None:
        return GrammarManager(
            None, group, no_backend="this server runs --skip-tokenizer-init (no vocabulary)"
        )
    if backend != "xgrammar":
        raise ValueError(f"--grammar-backend {backend!r} is not available (choose xgrammar or none)")

    def build():
        from sglang.srt.constrained.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, stop_token_ids, any_whitespace=any_whitespace)

    return GrammarManager(build, group, jump_forward=jump_forward)
