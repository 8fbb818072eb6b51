"""Dequantize GGUF tensors and stream them under HF transformers parameter names.

Two layout facts of llama.cpp's HF->GGUF converter are undone here:
- GGUF lists dims fastest-first (`ne0` = columns), so a tensor's torch shape is `reversed(t.shape)`.
- For `llama` it permutes the rows of q_proj/k_proj so each head's rotary pairs are interleaved
  (`hf_to_gguf_qk_permute`); `gguf_to_hf_qk_unpermute` restores HF's rotate-half layout.
"""

from __future__ import annotations

import re
from typing import Iterator, Optional, Union

import numpy as np
import torch

from sglang.srt.model_loader.gguf_config import (
    PERMUTED_QK_ARCHS,
    GGUFSource,
    field_value,
    gguf_arch,
    open_gguf,
)
from sglang.srt.model_loader.gguf_dequant import dequantize_gguf
from sglang.srt.model_loader.gguf_file import GGUFTensorInfo
from sglang.srt.model_loader.progress import progress

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.(weight|bias)$")


def gguf_to_hf_name(gguf_name: str) -> str:
    """HF parameter name for a GGUF tensor name (e.g. `blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`)."""
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    m = _GLOBAL_RE.match(gguf_name)
    if m and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    raise ValueError(f"unknown GGUF tensor name {gguf_name!r}")


def hf_to_gguf_qk_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp converter's q/k row permutation: per head, rows (2, d/2) -> (d/2, 2)."""
    rest = w.shape[1:]
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, 2, head_dim // 2, *rest).transpose(1, 2).reshape(w.shape)


def gguf_to_hf_qk_unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of `hf_to_gguf_qk_permute`: per head, rows (d/2, 2) -> (2, d/2)."""
    rest = w.shape[1:]
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, head_dim // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


def dequantize_tensor(t: GGUFTensorInfo) -> torch.Tensor:
    """float32 torch tensor of a GGUF tensor, in torch dim order."""
    shape = tuple(int(d) for d in reversed(list(t.shape)))
    arr = dequantize_gguf(t.data, t.tensor_type)
    return torch.from_numpy(np.ascontiguousarray(arr).reshape(shape))


def _resolve_dtype(dtype: Union[torch.dtype, str, None]) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return resolved


def iter_gguf_weights(
    source: GGUFSource, dtype: Union[torch.dtype, str, None] = torch.float32
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, tensor) for every GGUF tensor: dequantized to float32, un-permuted, cast to `dtype`.

    Tied models (no `output.weight`) yield no `lm_head.weight`, like HF checkpoints.
    """
    reader = open_gguf(source)
    arch = gguf_arch(reader)
    target = _resolve_dtype(dtype)
    n_head = int(field_value(reader, f"{arch}.attention.head_count"))
    n_kv = int(field_value(reader, f"{arch}.attention.head_count_kv", n_head))
    for t in progress(reader.tensors, "Dequantizing GGUF tensors", unit="tensor"):
        if t.name == "rope_freqs.weight":
            raise NotImplementedError("GGUF rope_freqs tensors are not supported")
        hf_name = gguf_to_hf_name(t.name)
        tensor = dequantize_tensor(t)
        if arch in PERMUTED_QK_ARCHS:
            heads: Optional[int] = None
            if hf_name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
                heads = n_head
            elif hf_name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
                heads = n_kv
            if heads is not None:
                tensor = gguf_to_hf_qk_unpermute(tensor, heads).contiguous()
        yield hf_name, tensor.to(target)
