"""`--trust-remote-code` reaches the config and tokenizer loaders: a model directory whose
config.json / tokenizer_config.json name their own Python classes (`auto_map`) is refused with a
message naming the flag without it, and loads (with those classes) with it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.tiny_models import TINY_LLAMA_DIR

CONFIG_CODE = """
from transformers import LlamaConfig


class CustomLlamaConfig(LlamaConfig):
    model_type = "custom_tiny_llama"
"""

TOKENIZER_CODE = """
from transformers import PreTrainedTokenizerFast


class CustomTokenizerFast(PreTrainedTokenizerFast):
    pass
"""


@pytest.fixture
def remote_code_model(tmp_path: Path) -> str:
    """tiny-llama with its own config class and tokenizer class (code in the model directory)."""
    path = tmp_path / "custom-tiny-llama"
    shutil.copytree(TINY_LLAMA_DIR, path)
    config = json.loads((path / "config.json").read_text())
    config["model_type"] = "custom_tiny_llama"
    config["auto_map"] = {"AutoConfig": "configuration_custom.CustomLlamaConfig"}
    (path / "config.json").write_text(json.dumps(config))
    (path / "configuration_custom.py").write_text(CONFIG_CODE)
    tok_config = json.loads((path / "tokenizer_config.json").read_text())
    tok_config["auto_map"] = {"AutoTokenizer": [None, "tokenization_custom.CustomTokenizerFast"]}
    tok_config.pop("tokenizer_class", None)
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    (path / "tokenization_custom.py").write_text(TOKENIZER_CODE)
    return str(path)


def _args(path: str, trust: bool) -> ServerArgs:
    return ServerArgs(
        model_path=path, load_format="dummy", dtype="float32", num_threads=1, trust_remote_code=trust
    )


def test_model_config_needs_the_flag(remote_code_model):
    with pytest.raises(ValueError, match="trust_remote_code"):
        ModelRunner(_args(remote_code_model, trust=False), ParallelGroups.single())


def test_model_config_loads_the_models_own_class_with_the_flag(remote_code_model):
    runner = ModelRunner(_args(remote_code_model, trust=True), ParallelGroups.single())
    assert type(runner.model_config.hf_config).__name__ == "CustomLlamaConfig"
    assert runner.model_config.num_hidden_layers == 4


def test_tokenizer_needs_the_flag(remote_code_model):
    with pytest.raises(ValueError, match="trust_remote_code"):
        get_tokenizer(remote_code_model)
    tok = get_tokenizer(remote_code_model, trust_remote_code=True)
    assert type(tok).__name__ == "CustomTokenizerFast"
    assert tok.encode("hello world") == get_tokenizer(TINY_LLAMA_DIR).encode("hello world")
