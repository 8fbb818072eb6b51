"""Rebuild an HF fast tokenizer from GGUF tokenizer metadata (`tokenizer.ggml.model == "gpt2"`, byte-level BPE).

The pre-tokenizer follows `tokenizer.ggml.pre` (the regex family llama.cpp uses for that vocab):
`smollm`/`starcoder`/`refact` split digits individually before the GPT-2 byte-level regex; `qwen2` and
`llama-bpe` use their own split regexes; anything else gets the plain GPT-2 byte-level regex.
"""

from __future__ import annotations

import logging
from typing import Any

from gguf import TokenType
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from sglang.srt.model_loader.gguf_config import GGUFSource, field_value, open_gguf

logger = logging.getLogger(__name__)

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DIGIT_SPLIT_PRES = frozenset({"smollm", "starcoder", "refact"})
_GPT2_PRES = frozenset({"default", "gpt2", "gpt-2"})
_QWEN2_PRES = frozenset({"qwen2", "deepseek-r1-qwen"})
_LLAMA3_PRES = frozenset({"llama-bpe", "llama3", "smaug-bpe"})


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in _DIGIT_SPLIT_PRES:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    split = {**{p: _QWEN2_SPLIT for p in _QWEN2_PRES}, **{p: _LLAMA3_SPLIT for p in _LLAMA3_PRES}}.get(pre)
    if split is not None:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
    if pre not in _GPT2_PRES:
        logger.warning("unknown GGUF pre-tokenizer %r; using the GPT-2 byte-level regex", pre)
    return byte_level


def _token_str(tokens: list[str], token_id: Any) -> str | None:
    if token_id is None or not (0 <= int(token_id) < len(tokens)):
        return None
    return tokens[int(token_id)]


def gguf_tokenizer_config(source: GGUFSource) -> dict[str, Any]:
    """tokenizer_config.json-style dict (special tokens, add_bos/eos flags, chat template) from GGUF metadata."""
    reader = open_gguf(source)
    tokens = field_value(reader, "tokenizer.ggml.tokens", [])
    arch = field_value(reader, "general.architecture", "")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(field_value(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(field_value(reader, "tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(field_value(reader, f"{arch}.context_length", 4096)),
    }
    for key, hf_key in (
        ("bos", "bos_token"),
        ("eos", "eos_token"),
        ("unknown", "unk_token"),
        ("padding", "pad_token"),
    ):
        config[hf_key] = _token_str(tokens, field_value(reader, f"tokenizer.ggml.{key}_token_id"))
    template = field_value(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config


def build_gguf_tokenizer_object(source: GGUFSource) -> Tokenizer:
    """A `tokenizers.Tokenizer` (byte-level BPE) equivalent to the GGUF vocab, merges and token types."""
    reader = open_gguf(source)
    model = field_value(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise NotImplementedError(
            f"GGUF tokenizer model {model!r} is not supported (only 'gpt2' byte-level BPE)"
        )
    tokens: list[str] = field_value(reader, "tokenizer.ggml.tokens")
    merges: list[str] = field_value(reader, "tokenizer.ggml.merges", [])
    types: list[int] = field_value(reader, "tokenizer.ggml.token_type") or [TokenType.NORMAL] * len(tokens)
    pre = field_value(reader, "tokenizer.ggml.pre", "default")

    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)
    merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
    bpe = models.BPE(
        vocab=vocab,
        merges=merge_pairs,
        fuse_unk=False,
        byte_fallback=False,
        ignore_merges=pre in _LLAMA3_PRES,
    )
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = _pre_tokenizer(pre)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)

    special = [
        AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == TokenType.CONTROL
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, k in zip(tokens, types)
        if k == TokenType.USER_DEFINED
    ]
    if special:
        tk.add_special_tokens(special)
    if user:
        tk.add_tokens(user)
    if tk.get_vocab_size(with_added_tokens=True) != len(vocab):
        raise ValueError("GGUF added tokens changed the vocabulary size; token list is inconsistent")
    return tk


def load_gguf_tokenizer(source: GGUFSource) -> PreTrainedTokenizerFast:
    """An HF fast tokenizer rebuilt from a GGUF file (with its chat template and special tokens)."""
    reader = open_gguf(source)
    tk = build_gguf_tokenizer_object(reader)
    config = gguf_tokenizer_config(reader)
    config.pop("tokenizer_class")
    return PreTrainedTokenizerFast(tokenizer_object=tk, **config)
