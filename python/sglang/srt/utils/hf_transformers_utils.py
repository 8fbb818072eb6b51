"""Tokenizer loading (HF directory or GGUF file, never the network) and chat template rendering."""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
from typing import Any, Optional

from transformers import PreTrainedTokenizerFast

from sglang.srt.model_loader.model_files import strip_dummy_prefix

PLAIN_FAST_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})


def get_tokenizer(tokenizer_path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerFast:
    """A fast tokenizer from an HF directory (tokenizer.json + tokenizer_config.json) or a .gguf file.

    `trust_remote_code` (`--trust-remote-code`) lets a directory's own tokenizer class (auto_map
    in tokenizer_config.json) run; without it transformers refuses such a tokenizer."""
    tokenizer_path = strip_dummy_prefix(tokenizer_path)
    if os.path.isfile(tokenizer_path) and tokenizer_path.lower().endswith(".gguf"):
        from sglang.srt.model_loader.gguf_tokenizer import load_gguf_tokenizer

        return load_gguf_tokenizer(tokenizer_path)
    if not os.path.isdir(tokenizer_path):
        raise ValueError(f"tokenizer path {tokenizer_path!r} is neither a directory nor a .gguf file")
    if not os.path.isfile(os.path.join(tokenizer_path, "tokenizer.json")):
        raise ValueError(f"tokenizer directory {tokenizer_path!r} has no tokenizer.json")
    if plain_fast_tokenizer_dir(tokenizer_path):
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_path, local_files_only=True)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            tokenizer_path, local_files_only=True, trust_remote_code=trust_remote_code
        )
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ValueError(
            f"tokenizer at {tokenizer_path!r} is not a fast tokenizer ({type(tokenizer).__name__})"
        )
    return tokenizer


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def plain_fast_tokenizer_dir(tokenizer_path: str) -> bool:
    """True when `AutoTokenizer` would load this directory as a plain `PreTrainedTokenizerFast`, so
    that `PreTrainedTokenizerFast.from_pretrained` gives the same tokenizer without AutoTokenizer's
    imports and its model config (about 2 CPU-s per process that loads a tokenizer).

    transformers 5's rules: tokenizer_config.json names the plain class and no own code
    (`auto_map`, in either file), and the model type is not one whose declared class AutoTokenizer
    replaces by its registered one (or by a Mistral backend). Anything else: AutoTokenizer."""
    tok_config = _read_json(os.path.join(tokenizer_path, "tokenizer_config.json"))
    config = _read_json(os.path.join(tokenizer_path, "config.json"))
    if tok_config is None or config is None or "auto_map" in tok_config or "auto_map" in config:
        return False
    if tok_config.get("tokenizer_class") not in PLAIN_FAST_CLASSES:
        return False
    tables = auto_tokenizer_tables()
    if tables is None:  # another transformers: its own rules
        return False
    incorrect_hub_class, mistral_types = tables
    model_type, model_name = config.get("model_type"), config.get("model_name")
    if not isinstance(model_type, str) or not isinstance(model_name, (str, type(None))):
        return False
    if model_type in incorrect_hub_class or model_name in incorrect_hub_class:
        return False
    return model_type not in mistral_types


@functools.lru_cache(maxsize=1)
def auto_tokenizer_tables() -> Optional[tuple[frozenset[str], frozenset[str]]]:
    """(model types whose Hub tokenizer class AutoTokenizer overrides, model types it may give a
    Mistral backend), read from transformers' `tokenization_auto.py` source without running it:
    importing that module imports torch (via the model configs), which a tokenizer does not need.
    None when the file does not have the expected shape (then AutoTokenizer decides)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "models", "auto", "tokenization_auto.py")
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return None
    incorrect, mistral = None, set()
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        name = target.id if isinstance(target, ast.Name) else None
        if name == "MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS" and node.value is not None:
            try:
                incorrect = frozenset(ast.literal_eval(node.value))
            except ValueError:
                return None
        elif name == "TOKENIZER_MAPPING_NAMES" and node.value is not None:
            mistral |= _mistral_backend_types(node.value)
    return None if incorrect is None or not mistral else (incorrect, frozenset(mistral))


def _mistral_backend_types(mapping: ast.AST) -> set[str]:
    """Model types of the `(model_type, class expression)` pairs whose class expression can give
    `MistralCommonBackend` (whether mistral_common is installed or not: the safe side)."""
    found = set()
    for pair in ast.walk(mapping):
        if not (isinstance(pair, ast.Tuple) and len(pair.elts) == 2):
            continue
        key = pair.elts[0]
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            if any(
                isinstance(n, ast.Constant) and n.value == "MistralCommonBackend"
                for n in ast.walk(pair.elts[1])
            ):
                found.add(key.value)
    return found


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
