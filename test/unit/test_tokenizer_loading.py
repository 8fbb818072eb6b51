"""`get_tokenizer` loads a plain fast tokenizer directory without AutoTokenizer, to the same tokenizer.

`plain_fast_tokenizer_dir` answers when AutoTokenizer would build a plain `PreTrainedTokenizerFast`
anyway (its rules in transformers 5); then `PreTrainedTokenizerFast.from_pretrained` is used, which
skips AutoTokenizer's imports and model config (each server process that loads a tokenizer). The
tokenizers of the test models must come out identical to AutoTokenizer's: backend, special tokens,
chat template, encodings; directories AutoTokenizer treats otherwise keep AutoTokenizer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import pytest
from transformers import AutoTokenizer

from sglang.srt.utils.hf_transformers_utils import get_tokenizer, plain_fast_tokenizer_dir
from sglang.test.tiny_models import ASSETS_DIR

ASSETS = ["tiny-llama", "tiny-qwen3", "tiny-deepseek-v32"]
TEXTS = ["Hello world", "<|im_start|>user\nHéllo 世界 🙂<|im_end|>\n", "  spaces\tand 123 digits</s><s>"]
MESSAGES = [{"role": "user", "content": "Hi 世界"}, {"role": "assistant", "content": "Hello!"}]


def _summary(tok) -> dict:
    """What the server uses of a tokenizer."""
    return {
        "type": type(tok),
        "backend": tok.backend_tokenizer.to_str(),
        "special": tok.special_tokens_map,
        "special_ids": tok.all_special_ids,
        "added": {i: str(t) for i, t in tok.added_tokens_decoder.items()},
        "len": len(tok),
        "chat_template": tok.chat_template,
        "max_length": tok.model_max_length,
        "encodings": [tok.encode(t, add_special_tokens=s) for t in TEXTS for s in (True, False)],
        "calls": [tok(t)["input_ids"] for t in TEXTS],
        "chat": tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        if tok.chat_template
        else None,
        "decodes": [tok.decode(tok.encode(t), skip_special_tokens=s) for t in TEXTS for s in (True, False)],
    }


@pytest.mark.parametrize("name", ASSETS)
def test_plain_fast_directory_loads_as_autotokenizer_does(name):
    path = f"{ASSETS_DIR}/{name}"
    assert plain_fast_tokenizer_dir(path)
    assert _summary(get_tokenizer(path)) == _summary(
        AutoTokenizer.from_pretrained(path, local_files_only=True)
    )


def _variant(tmp_path: Path, config: Optional[dict] = None, tok_config: Optional[dict] = None) -> str:
    path = tmp_path / "tok"
    shutil.copytree(f"{ASSETS_DIR}/tiny-qwen3", path)
    for file, changes in (("config.json", config), ("tokenizer_config.json", tok_config)):
        data = json.loads((path / file).read_text())
        data.update(changes or {})
        (path / file).write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize(
    "config,tok_config",
    [
        ({"model_type": "qwen2"}, {}),  # AutoTokenizer replaces the declared class by Qwen2Tokenizer
        ({}, {"tokenizer_class": "Qwen2Tokenizer"}),
        ({}, {"auto_map": {"AutoTokenizer": [None, "tokenization_x.X"]}}),
        ({"auto_map": {"AutoConfig": "configuration_x.X"}}, {}),
    ],
)
def test_other_directories_keep_autotokenizer(tmp_path, config, tok_config):
    assert plain_fast_tokenizer_dir(_variant(tmp_path))
    shutil.rmtree(tmp_path / "tok")
    assert not plain_fast_tokenizer_dir(_variant(tmp_path, config, tok_config))


def test_tables_read_from_source_match_the_imported_module():
    """`auto_tokenizer_tables` parses transformers' tokenization_auto.py instead of importing it
    (the import pulls torch): it must find the same override set, and at least every model type the
    imported mapping sends to the Mistral backend (all that can, whatever is installed)."""
    from transformers.models.auto import tokenization_auto as ta

    from sglang.srt.utils.hf_transformers_utils import auto_tokenizer_tables

    tables = auto_tokenizer_tables()
    assert tables is not None
    incorrect, mistral = tables
    assert incorrect == frozenset(ta.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS)
    imported = {k for k, v in ta.TOKENIZER_MAPPING_NAMES.items() if v == "MistralCommonBackend"}
    assert imported <= mistral
    assert {"mistral", "mixtral"} <= mistral
