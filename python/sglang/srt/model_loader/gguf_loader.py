"""GGUF entry points: config, weights, tokenizer, and conversion to an HF directory.

The work is split across `gguf_config.py` (metadata -> HF config), `gguf_weights.py` (dequantize +
rename + un-permute) and `gguf_tokenizer.py` (metadata -> fast tokenizer); this module re-exports them
and writes whole HF directories for comparisons with transformers / vLLM.
"""

from __future__ import annotations

import json
import os
from typing import Any, Union

import torch
from safetensors.torch import save_file

from sglang.srt.model_loader.gguf_config import GGUFSource, gguf_to_hf_config, open_gguf
from sglang.srt.model_loader.gguf_tokenizer import (
    build_gguf_tokenizer_object,
    gguf_tokenizer_config,
    load_gguf_tokenizer,
)
from sglang.srt.model_loader.gguf_weights import (
    gguf_to_hf_qk_unpermute,
    hf_to_gguf_qk_permute,
    iter_gguf_weights,
)

__all__ = [
    "gguf_to_hf_config",
    "iter_gguf_weights",
    "load_gguf_tokenizer",
    "gguf_to_hf_dir",
    "hf_to_gguf_qk_permute",
    "gguf_to_hf_qk_unpermute",
]


def _write_json(path: str, data: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _dtype_name(dtype: Union[torch.dtype, str]) -> str:
    name = str(dtype).removeprefix("torch.")
    if not isinstance(getattr(torch, name, None), torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return name


def gguf_to_hf_dir(gguf_path: GGUFSource, out_dir: str, dtype: Union[torch.dtype, str] = "bfloat16") -> str:
    """Write an HF model directory (config, generation config, model.safetensors, tokenizer files).

    Weights are dequantized to float32 and cast to `dtype`. Returns `out_dir`.
    """
    reader = open_gguf(gguf_path)
    dtype_name = _dtype_name(dtype)
    os.makedirs(out_dir, exist_ok=True)

    config = gguf_to_hf_config(reader)
    config["torch_dtype"] = dtype_name
    _write_json(os.path.join(out_dir, "config.json"), config)
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    _write_json(os.path.join(out_dir, "generation_config.json"), gen)

    tensors = {name: t.contiguous() for name, t in iter_gguf_weights(reader, getattr(torch, dtype_name))}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    del tensors

    build_gguf_tokenizer_object(reader).save(os.path.join(out_dir, "tokenizer.json"))
    _write_json(os.path.join(out_dir, "tokenizer_config.json"), gguf_tokenizer_config(reader))
    return out_dir
