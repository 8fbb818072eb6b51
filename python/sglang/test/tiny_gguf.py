"""Write a GGUF file from a tiny HF checkpoint the way llama.cpp's converter lays it out.

Used by tests to check the GGUF loader end to end against known HF tensors: GGUF names, reversed
dims, llama q/k row permutation, optional quantization of 2-D weights, and tokenizer metadata taken
from tokenizer.json / tokenizer_config.json.
"""

from __future__ import annotations

import json
import os
from typing import Any

import gguf
import numpy as np
import torch

from sglang.srt.model_loader.gguf_weights import hf_to_gguf_qk_permute
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights

_HF_TO_GGUF_BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_HF_TO_GGUF_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def hf_to_gguf_name(hf_name: str) -> str:
    """GGUF tensor name of an HF llama/qwen parameter name."""
    stem, suffix = hf_name.rsplit(".", 1)
    if stem in _HF_TO_GGUF_GLOBAL:
        return f"{_HF_TO_GGUF_GLOBAL[stem]}.{suffix}"
    parts = stem.split(".", 3)  # model, layers, N, rest
    return f"blk.{parts[2]}.{_HF_TO_GGUF_BLOCK[parts[3]]}.{suffix}"


def _add_tokenizer(writer: gguf.GGUFWriter, hf_dir: str, pre: str) -> None:
    with open(os.path.join(hf_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    with open(os.path.join(hf_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        tok_cfg = json.load(f)
    vocab: dict[str, int] = dict(tok["model"]["vocab"])
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    for t in tok["added_tokens"]:
        vocab[t["content"]] = t["id"]
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    )
    writer.add_token_merges(merges)
    for key, add in (
        ("bos_token", writer.add_bos_token_id),
        ("eos_token", writer.add_eos_token_id),
        ("pad_token", writer.add_pad_token_id),
    ):
        if tok_cfg.get(key):
            add(vocab[tok_cfg[key]])
    writer.add_add_bos_token(bool(tok_cfg.get("add_bos_token", False)))
    if tok_cfg.get("chat_template"):
        writer.add_chat_template(tok_cfg["chat_template"])


def _gguf_array(hf_name: str, tensor: torch.Tensor, config: dict[str, Any], arch: str, qtype: str):
    arr = tensor.to(torch.float32)
    if arch == "llama" and hf_name.endswith("self_attn.q_proj.weight"):
        arr = hf_to_gguf_qk_permute(arr, config["num_attention_heads"])
    elif arch == "llama" and hf_name.endswith("self_attn.k_proj.weight"):
        arr = hf_to_gguf_qk_permute(arr, config["num_key_value_heads"])
    data = np.ascontiguousarray(arr.numpy())
    if data.ndim != 2 or qtype == "F32":
        return data, None
    kind = gguf.GGMLQuantizationType[qtype]
    return gguf.quants.quantize(data, kind), kind


def write_tiny_gguf(hf_dir: str, out_path: str, qtype: str = "F32", pre: str = "gpt2") -> str:
    """Write `out_path` (GGUF, arch from config model_type) from an HF llama/qwen2/qwen3 directory.

    `qtype` ("F32", "Q8_0", "Q4_1", ...) applies to 2-D weights; norms stay F32. Returns `out_path`.
    """
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    arch = config["model_type"]
    writer = gguf.GGUFWriter(out_path, arch)
    writer.add_name(os.path.basename(os.path.normpath(hf_dir)))
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else gguf.LlamaFileType.GUESSED)
    _add_tokenizer(writer, hf_dir, pre)
    for name, tensor in iter_safetensors_weights(hf_dir):
        data, kind = _gguf_array(name, tensor, config, arch, qtype)
        writer.add_tensor(hf_to_gguf_name(name), data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
