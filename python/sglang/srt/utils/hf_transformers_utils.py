"""Tokenizer loading (HF directory or GGUF file, never the network) and chat template rendering."""

from __future__ import annotations

import os
from typing import Any, Optional

from transformers import AutoTokenizer, PreTrainedTokenizerFast


def get_tokenizer(tokenizer_path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerFast:
    """A fast tokenizer from an HF directory (tokenizer.json + tokenizer_config.json) or a .gguf file.

    `trust_remote_code` (`--trust-remote-code`) lets a directory's own tokenizer class (auto_map
    in tokenizer_config.json) run; without it transformers refuses such a tokenizer."""
    if tokenizer_path.startswith("dummy:"):
        tokenizer_path = tokenizer_path[len("dummy:") :]
    if os.path.isfile(tokenizer_path) and tokenizer_path.lower().endswith(".gguf"):
        from sglang.srt.model_loader.gguf_tokenizer import load_gguf_tokenizer

        return load_gguf_tokenizer(tokenizer_path)
    if not os.path.isdir(tokenizer_path):
        raise ValueError(f"tokenizer path {tokenizer_path!r} is neither a directory nor a .gguf file")
    if not os.path.isfile(os.path.join(tokenizer_path, "tokenizer.json")):
        raise ValueError(f"tokenizer directory {tokenizer_path!r} has no tokenizer.json")
    tokenizer = AutoTokenizer.from_pretrained(
        tokenizer_path, local_files_only=True, trust_remote_code=trust_remote_code
    )
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ValueError(
            f"tokenizer at {tokenizer_path!r} is not a fast tokenizer ({type(tokenizer).__name__})"
        )
    return tokenizer


def apply_chat_template(
    tokenizer: PreTrainedTokenizerFast,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    chat_template: Optional[str] = None,
    **kwargs: Any,
) -> str:
    """Render `messages` with the tokenizer's (or the given) chat template; ValueError when there is none."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            f"the tokenizer of {getattr(tokenizer, 'name_or_path', '') or 'this model'!r} has no chat template; "
            "use the completions API or pass --chat-template"
        )
    return tokenizer.apply_chat_template(
        messages,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
