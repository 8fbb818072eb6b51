"""A compressed-tensors W8A8-INT8 checkpoint of a Llama config with random weights, its LM head in
int8 too (untied), for served_dtypes.py's `--dummy-llama-1b --w8a8-lm-head`: `--load-format dummy`
cannot give a quantized head (online quantization keeps the head float, as upstream does), so this
writes one. Weights: uniform int8 with a per-row scale giving a ~0.02 standard deviation (the speed
is the point; the tokens are noise, as under `--load-format dummy`)."""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from sglang.test.tiny_w8a8_models import w8a8_config

STD = 0.02


def _int8(rows: int, cols: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    q = torch.randint(-127, 128, (rows, cols), generator=g, dtype=torch.int8)
    scale = torch.full((rows, 1), STD * 3**0.5 / 127, dtype=torch.bfloat16)
    return {"": q, "_scale": scale}


def _linears(cfg: dict) -> list[tuple[str, int, int]]:
    """(name, out, in) of every decoder linear of a Llama config."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h)}
    shapes |= {"self_attn.o_proj": (h, q), "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h)}
    shapes["mlp.down_proj"] = (h, inter)
    return [
        (f"model.layers.{i}.{n}", o, k)
        for i in range(cfg["num_hidden_layers"])
        for n, (o, k) in shapes.items()
    ]


def write_random_w8a8(cfg: dict, out_dir: str, tokenizer_dir: str, tokenizer_files: tuple) -> str:
    """The checkpoint of `cfg` (untied, int8 head) in out_dir (written once; kept if complete)."""
    done = os.path.join(out_dir, ".complete")
    if os.path.isfile(done):
        return out_dir
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    tensors = {"model.embed_tokens.weight": (torch.randn(vocab, h, generator=g) * STD).bfloat16()}
    for name, rows, cols in tqdm(_linears(cfg), desc="random int8 linears"):
        tensors |= {f"{name}.weight{k}": v for k, v in _int8(rows, cols, g).items()}
    for i in range(cfg["num_hidden_layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{i}.{norm}.weight"] = torch.ones(h, dtype=torch.bfloat16)
    tensors["model.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    tensors |= {f"lm_head.weight{k}": v for k, v in _int8(vocab, h, g).items()}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    config = {
        **cfg,
        "tie_word_embeddings": False,
        "quantization_config": w8a8_config("compressed-tensors", True),
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    for name in tokenizer_files:
        if os.path.isfile(os.path.join(tokenizer_dir, name)):
            shutil.copy(os.path.join(tokenizer_dir, name), out_dir)
    open(done, "w").close()
    return out_dir
