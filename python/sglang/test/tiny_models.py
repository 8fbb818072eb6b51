"""Tiny model directories for tests, and seeded random checkpoints that transformers and sglang both load.

`write_random_checkpoint(TINY_LLAMA_DIR, tmp_path, seed=0)` instantiates the transformers model class of
the config, fills it with seeded random weights (see `randomize_parameters`), saves it as safetensors and
copies the tokenizer files and the original config.json next to it.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib

import torch

ASSETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
TINY_LLAMA_DIR = os.path.join(ASSETS_DIR, "tiny-llama")
TINY_QWEN3_DIR = os.path.join(ASSETS_DIR, "tiny-qwen3")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@torch.no_grad()
def randomize_parameters(model: torch.nn.Module, seed: int, std: float = 0.2) -> None:
    """Seeded float32 init by parameter name: norm weights 1 + N(0, 0.1), everything else N(0, std).

    std 0.2 (not the usual 0.02) keeps tiny models' logits spread out so greedy outputs vary with the
    prompt, and non-unit norm weights make a loader that drops them fail parity tests.
    """
    for name, param in model.named_parameters():
        gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1))
        values = torch.empty(param.shape, dtype=torch.float32)
        if param.dim() == 1 and "norm" in name:
            values.normal_(1.0, 0.1, generator=gen)
        else:
            values.normal_(0.0, std, generator=gen)
        param.copy_(values.to(param.dtype))


def write_random_checkpoint(
    src_dir: str, out_dir: str, seed: int, dtype: torch.dtype = torch.float32, std: float = 0.2
) -> str:
    """Save a seeded random checkpoint of the model described by `src_dir` into `out_dir`; returns `out_dir`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out_dir = str(out_dir)
    config = AutoConfig.from_pretrained(src_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config)
    model.to(torch.float32)
    randomize_parameters(model, seed, std)
    model.to(dtype)
    model.save_pretrained(out_dir, safe_serialization=True)

    # Keep the plain HF config schema of the asset (save_pretrained may rewrite fields, e.g. rope).
    with open(os.path.join(src_dir, "config.json"), encoding="utf-8") as f:
        raw = json.load(f)
    raw["torch_dtype"] = str(dtype).removeprefix("torch.")
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(raw, f, indent=2)
    for name in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(src_dir, name), os.path.join(out_dir, name))
    return out_dir
