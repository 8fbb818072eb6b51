"""ModelConfig: sizes, dtype policy, context length and EOS ids from config.json or a GGUF file."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, Qwen3Config

from sglang.srt.configs.model_config import ModelConfig, resolve_dtype
from sglang.srt.platforms.cpu import choose_dtype
from sglang.test.tiny_models import TINY_LLAMA_DIR


def _write(tmp_path, cfg, generation_eos=None):
    cfg.save_pretrained(tmp_path)
    if generation_eos is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    return str(tmp_path)


def test_reads_sizes_eos_and_context(tmp_path):
    cfg = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=3,
        vocab_size=300,
        max_position_embeddings=777,
        eos_token_id=2,
        architectures=["LlamaForCausalLM"],
    )
    path = _write(tmp_path, cfg, generation_eos=[2, 9])
    mc = ModelConfig(path)
    assert mc.architectures == ["LlamaForCausalLM"]
    assert (mc.num_hidden_layers, mc.hidden_size, mc.num_attention_heads, mc.num_key_value_heads) == (
        3,
        64,
        4,
        2,
    )
    assert mc.head_dim == 16 and mc.vocab_size == 300
    assert mc.context_len == 777
    assert mc.eos_token_ids == [2, 9]
    assert mc.dtype == choose_dtype().dtype  # auto on CPU: from this CPU's flags (test_cpu_dtype.py)
    assert mc.get_num_kv_heads(4) == 1 and mc.get_num_kv_heads(2) == 1 and mc.get_num_kv_heads(1) == 2
    assert ModelConfig(path, context_length=100).context_len == 100
    with pytest.raises(ValueError, match="max_position_embeddings"):
        ModelConfig(path, context_length=778)
    assert ModelConfig(path, dtype="float32").dtype == torch.float32
    assert ModelConfig("dummy:" + path, load_format="dummy").model_path == path


def test_head_dim_from_config_and_dtype_policy(tmp_path):
    cfg = Qwen3Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_hidden_layers=1
    )
    mc = ModelConfig(_write(tmp_path, cfg))
    assert mc.head_dim == 32 and mc.model_type == "qwen3"
    with pytest.raises(ValueError, match="float16"):
        ModelConfig(str(tmp_path), dtype="float16")
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", mc.hf_config)
    half_cfg = LlamaConfig(torch_dtype="float16")
    assert resolve_dtype("auto", half_cfg, device="cuda") == torch.float16
    assert resolve_dtype("auto", half_cfg, device="cpu") == choose_dtype().dtype  # not the config's float16


def test_bad_paths(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        ModelConfig(str(tmp_path))
    with pytest.raises(ValueError):
        ModelConfig(str(tmp_path / "missing"))


def test_gguf_config(tmp_path):
    from sglang.test.tiny_gguf import write_tiny_gguf
    from sglang.test.tiny_models import write_random_checkpoint

    hf_dir = write_random_checkpoint(TINY_LLAMA_DIR, str(tmp_path / "hf"), seed=0)
    path = write_tiny_gguf(hf_dir, str(tmp_path / "tiny.gguf"))
    mc = ModelConfig(path)
    ref = ModelConfig(hf_dir)
    sizes = (
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
    )
    for attr in sizes:
        assert getattr(mc, attr) == getattr(ref, attr), attr
    assert mc.architectures == ["LlamaForCausalLM"]
    assert 2 in mc.eos_token_ids
