"""ModelConfig: the normalised view of a model's HF config that the rest of the engine reads.

Sources: a directory with config.json (read with `transformers.AutoConfig`, local files only) or a
single .gguf file (its metadata turned into an HF config dict by the weight-loader package).
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import torch
import transformers

from sglang.srt.model_loader.model_files import strip_dummy_prefix

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


def is_gguf_path(model_path: str, load_format: str = "auto") -> bool:
    """True when the model is a single GGUF file (by flag or by file name)."""
    return load_format == "gguf" or (os.path.isfile(model_path) and model_path.endswith(".gguf"))


def load_hf_config(model_path: str, load_format: str = "auto", trust_remote_code: bool = False):
    """The `transformers.PretrainedConfig` of a model directory or GGUF file."""
    if is_gguf_path(model_path, load_format):
        from sglang.srt.model_loader.gguf_loader import gguf_to_hf_config

        config_dict = dict(gguf_to_hf_config(model_path))
        if "model_type" not in config_dict:
            raise ValueError(f"GGUF config of {model_path!r} has no model_type")
        return transformers.AutoConfig.for_model(**config_dict)
    if not os.path.isdir(model_path):
        raise ValueError(
            f"model path {model_path!r} is neither a directory with config.json nor a .gguf file"
        )
    if not os.path.isfile(os.path.join(model_path, "config.json")):
        raise ValueError(f"model directory {model_path!r} has no config.json")
    return transformers.AutoConfig.from_pretrained(
        model_path, local_files_only=True, trust_remote_code=trust_remote_code
    )


def resolve_dtype(requested: str, hf_config: Any, device: str = "cpu") -> torch.dtype:
    """Turn `--dtype` into a torch dtype. `auto` is the platform's choice (`Platform.resolve_auto_dtype`):
    on CPU from the instructions the CPU has (platforms/cpu.py, logged), elsewhere the config's half type."""
    from sglang.srt.platforms import get_platform

    platform = get_platform(device)
    if requested != "auto":
        if requested not in _DTYPES:
            raise ValueError(f"--dtype must be one of auto, float32, bfloat16, float16; got {requested!r}")
        dtype = _DTYPES[requested]
        platform.use_explicit_dtype(dtype)  # an explicit dtype runs as given (no mixed GEMMs)
    else:
        dtype = platform.resolve_auto_dtype(hf_config)
    if device == "cpu" and dtype == torch.float16:
        raise ValueError("--dtype float16 is not supported on CPU (use bfloat16 or float32)")
    return dtype


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


class ModelConfig:
    """Architecture sizes, dtype, context length and EOS ids of the served model."""

    def __init__(
        self,
        model_path: str,
        load_format: str = "auto",
        dtype: str = "auto",
        context_length: Optional[int] = None,
        device: str = "cpu",
        trust_remote_code: bool = False,
        override_args: Optional[dict[str, Any]] = None,
    ):
        model_path = strip_dummy_prefix(model_path)  # `dummy:<path>`: random weights, config of <path>
        self.model_path = model_path
        self.load_format = load_format
        self.device = device
        self.hf_config = load_hf_config(model_path, load_format, trust_remote_code)
        self.hf_config.update(override_args or {})  # --json-model-override-args
        cfg = self.hf_config
        self.model_type: str = getattr(cfg, "model_type", "")
        self.architectures: list[str] = list(getattr(cfg, "architectures", None) or [])
        self.num_hidden_layers: int = int(cfg.num_hidden_layers)
        self.hidden_size: int = int(cfg.hidden_size)
        self.num_attention_heads: int = int(cfg.num_attention_heads)
        kv_heads = getattr(cfg, "num_key_value_heads", None)
        self.num_key_value_heads: int = int(kv_heads if kv_heads is not None else self.num_attention_heads)
        self.head_dim: int = int(
            getattr(cfg, "head_dim", None) or self.hidden_size // self.num_attention_heads
        )
        self.vocab_size: int = int(cfg.vocab_size)
        self.intermediate_size: Optional[int] = getattr(cfg, "intermediate_size", None)
        self.tie_word_embeddings: bool = bool(getattr(cfg, "tie_word_embeddings", False))
        self.dtype: torch.dtype = resolve_dtype(dtype, cfg, device)
        self.context_len: int = self._context_len(context_length)
        self.eos_token_ids: list[int] = self._eos_token_ids()

    # ------------------------------------------------------------------ derived
    @property
    def max_position_embeddings(self) -> Optional[int]:
        return getattr(self.hf_config, "max_position_embeddings", None)

    def get_num_kv_heads(self, tp_size: int) -> int:
        """KV heads held by one TP rank (KV heads are replicated when there are fewer than ranks)."""
        return max(1, self.num_key_value_heads // tp_size)

    def _context_len(self, override: Optional[int]) -> int:
        derived = self.max_position_embeddings
        if override is not None:
            if override < 1:
                raise ValueError(f"--context-length must be >= 1, got {override}")
            if derived is not None and override > derived:
                raise ValueError(
                    f"--context-length {override} exceeds the model's max_position_embeddings {derived}"
                )
            return int(override)
        return int(derived) if derived else 2048

    def _eos_token_ids(self) -> list[int]:
        ids = _as_id_list(getattr(self.hf_config, "eos_token_id", None))
        gen_path = os.path.join(self.model_path, "generation_config.json")
        if os.path.isdir(self.model_path) and os.path.isfile(gen_path):
            with open(gen_path, encoding="utf-8") as f:
                ids += _as_id_list(json.load(f).get("eos_token_id"))
        return list(dict.fromkeys(ids))

    def __repr__(self) -> str:
        return (
            f"ModelConfig(path={self.model_path!r}, arch={self.architectures}, layers={self.num_hidden_layers}, "
            f"hidden={self.hidden_size}, heads={self.num_attention_heads}/{self.num_key_value_heads}, "
            f"head_dim={self.head_dim}, vocab={self.vocab_size}, dtype={self.dtype}, ctx={self.context_len})"
        )
