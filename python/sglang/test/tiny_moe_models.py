"""Tiny MoE / MLA / DSA configs (transformers config classes) and seeded random checkpoints for tests.

    hf = save_random_model(deepseek_v32_config(), out_dir)   # safetensors + config.json + tokenizer

Sizes: hidden 64, 3 layers (the first dense), 4 heads, q/kv LoRA 32, qk_nope 16, qk_rope 8, v 16,
8 routed experts top-2 in 2 groups (top-1 group), 1 shared expert; V3.2 indexer 16 heads x 32 with
index_topk 8 (16 heads make exact score ties, where the choice is implementation-defined,
practically impossible).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch
import transformers
from transformers import DeepseekV3Config, DeepseekV32Config, Qwen3MoeConfig

from sglang.test.tiny_models import TINY_LLAMA_DIR, TOKENIZER_FILES, randomize_parameters

VOCAB = 256
DEEPSEEK_SIZES: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
)
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "rope_theta": 10000.0,
}


def deepseek_v3_config() -> DeepseekV3Config:
    """V3 with a plain q_proj (q_lora_rank None) and YaRN rope scaling."""
    return DeepseekV3Config(q_lora_rank=None, rope_parameters=dict(YARN), **DEEPSEEK_SIZES)


def deepseek_v32_config(index_topk: int = 8) -> DeepseekV32Config:
    return DeepseekV32Config(
        q_lora_rank=32, index_n_heads=16, index_head_dim=32, index_topk=index_topk, **DEEPSEEK_SIZES
    )


def qwen3_moe_config() -> Qwen3MoeConfig:
    """Qwen3-MoE with layer 0 dense (mlp_only_layers) and normalised top-2 of 8 experts."""
    return Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        mlp_only_layers=[0],
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
    )


def save_random_model(config: Any, out_dir: str, seed: int = 3) -> torch.nn.Module:
    """Save a seeded random HF model of `config` (float32) with the tiny tokenizer into out_dir; returns it."""
    hf = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    randomize_parameters(hf, seed=seed, std=0.2)
    hf.save_pretrained(str(out_dir))
    for name in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(TINY_LLAMA_DIR, name), os.path.join(str(out_dir), name))
    return hf


def save_tiny_v32(out_dir, index_topk: int = 8, seed: int = 11) -> str:
    """The DSA tests' random tiny DeepSeek-V3.2 checkpoint, saved into out_dir; returns its path."""
    save_random_model(deepseek_v32_config(index_topk=index_topk), str(out_dir), seed=seed)
    return str(out_dir)
