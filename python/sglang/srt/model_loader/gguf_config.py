"""Read GGUF metadata and turn it into an HF `config.json`-style dict.

Supported GGUF architectures: `llama` (SmolLM2, Llama 1/2-style), `qwen2` and `qwen3`.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Union

import numpy as np
from gguf import LlamaFileType

from sglang.srt.model_loader.gguf_file import GGUFFile, read_gguf

GGUFSource = Union[str, GGUFFile]

# GGUF `general.architecture` -> (HF architectures entry, HF model_type)
SUPPORTED_ARCHS: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}

# GGUF archs whose q/k rows llama.cpp's converter permuted for its rotary layout.
PERMUTED_QK_ARCHS = frozenset({"llama"})

_HALF_FILE_TYPES = {
    LlamaFileType.MOSTLY_F16: "float16",
    LlamaFileType.MOSTLY_BF16: "bfloat16",
}


def open_gguf(source: GGUFSource) -> GGUFFile:
    """The parsed file for a path (tensors memory-mapped, read-only), or the parsed file itself.
    A process opens one file several times (config, tokenizer, weights): the last two parsed files
    are kept, keyed by path, size and modification time (a rewritten file is parsed again)."""
    if isinstance(source, GGUFFile):
        return source
    st = os.stat(source)
    return _read_cached(os.path.realpath(source), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _read_cached(path: str, size: int, mtime_ns: int) -> GGUFFile:
    return read_gguf(path)


def field_value(reader: GGUFFile, key: str, default: Any = None) -> Any:
    """Decoded value of metadata `key` (str, number, bool or list), or `default` when absent."""
    return reader.value(key, default)


def _f32(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (9.9999997e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def gguf_arch(reader: GGUFFile) -> str:
    """`general.architecture`, validated against SUPPORTED_ARCHS."""
    arch = field_value(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise NotImplementedError(
            f"GGUF architecture {arch!r} is not supported (supported: {sorted(SUPPORTED_ARCHS)})"
        )
    return arch


def _tensor_shape(reader: GGUFFile, name: str) -> tuple[int, ...] | None:
    """Shape of tensor `name` in torch/numpy order (GGUF stores dims fastest-first), or None."""
    for t in reader.tensors:
        if t.name == name:
            return tuple(int(d) for d in reversed(list(t.shape)))
    return None


def _require(reader: GGUFFile, key: str) -> Any:
    value = field_value(reader, key)
    if value is None:
        raise ValueError(f"GGUF file lacks required metadata key {key!r}")
    return value


def _rope_scaling(reader: GGUFFile, arch: str) -> dict | None:
    kind = field_value(reader, f"{arch}.rope.scaling.type", "none")
    if kind in (None, "none"):
        return None
    factor = _f32(_require(reader, f"{arch}.rope.scaling.factor"))
    if kind == "linear":
        return {"rope_type": "linear", "type": "linear", "factor": factor}
    raise NotImplementedError(f"GGUF rope scaling type {kind!r} is not supported")


def _torch_dtype(reader: GGUFFile) -> str:
    """float16/bfloat16 for half-precision files; float32 for F32 and quantized files (dequantized to f32)."""
    file_type = field_value(reader, "general.file_type")
    try:
        return _HALF_FILE_TYPES.get(LlamaFileType(file_type), "float32")
    except ValueError:
        return "float32"


def gguf_to_hf_config(source: GGUFSource) -> dict[str, Any]:
    """An HF config.json-style dict describing the model stored in a GGUF file."""
    reader = open_gguf(source)
    arch = gguf_arch(reader)
    hf_arch, model_type = SUPPORTED_ARCHS[arch]
    if _tensor_shape(reader, "rope_freqs.weight") is not None:
        raise NotImplementedError(
            "GGUF files with a rope_freqs tensor (Llama 3.1-style rope) are not supported"
        )

    hidden = int(_require(reader, f"{arch}.embedding_length"))
    n_head = int(_require(reader, f"{arch}.attention.head_count"))
    n_kv = int(field_value(reader, f"{arch}.attention.head_count_kv", n_head))
    head_dim = int(field_value(reader, f"{arch}.attention.key_length", hidden // n_head))
    rope_dim = field_value(reader, f"{arch}.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != head_dim:
        raise NotImplementedError(
            f"partial rotary (rope dim {rope_dim} != head dim {head_dim}) is not supported"
        )
    n_layers = int(_require(reader, f"{arch}.block_count"))

    embd_shape = _tensor_shape(reader, "token_embd.weight")
    if embd_shape is None:
        raise ValueError("GGUF file has no token_embd.weight tensor")
    vocab_size = int(embd_shape[0])

    config: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": int(_require(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _f32(field_value(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": _f32(field_value(reader, f"{arch}.rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(reader, arch),
        "max_position_embeddings": int(field_value(reader, f"{arch}.context_length", 4096)),
        "vocab_size": vocab_size,
        "tie_word_embeddings": _tensor_shape(reader, "output.weight") is None,
        "attention_bias": _tensor_shape(reader, "blk.0.attn_q.bias") is not None,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": _torch_dtype(reader),
    }
    if model_type == "llama":
        config["mlp_bias"] = False
    else:
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=n_layers)
    for key, hf_key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("padding", "pad_token_id")):
        value = field_value(reader, f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            config[hf_key] = int(value)
    return config
