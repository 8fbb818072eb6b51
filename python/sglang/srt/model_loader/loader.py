"""Pick a load format for a model path, read its HF config, and fill a model's weights.

Formats: `gguf` (a .gguf file), `safetensors` (an HF directory with *.safetensors), `pt` (an HF
directory with torch `.bin` files), `dummy` (deterministic random weights; the config still comes
from the path). `auto` picks from the path: a .gguf file, else safetensors, else `.bin`.
A path written `dummy:<path>` means dummy weights with the config of `<path>`.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Iterator, Optional, Union

import torch

from sglang.srt.model_loader.dummy_loader import init_dummy_weights
from sglang.srt.model_loader.pt_loader import iter_pt_weights, list_pt_files
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights

LOAD_FORMATS = ("auto", "safetensors", "pt", "gguf", "dummy")
DUMMY_PREFIX = "dummy:"
DtypeLike = Union[torch.dtype, str, None]


def strip_dummy_prefix(model_path: str) -> str:
    """`dummy:<path>` -> `<path>`; other paths unchanged."""
    return model_path[len(DUMMY_PREFIX) :] if model_path.startswith(DUMMY_PREFIX) else model_path


def _is_gguf_file(path: str) -> bool:
    return os.path.isfile(path) and path.lower().endswith(".gguf")


def _has_safetensors(path: str) -> bool:
    return os.path.isdir(path) and bool(glob.glob(os.path.join(path, "*.safetensors")))


def _has_pt(path: str) -> bool:
    if not os.path.isdir(path):
        return False
    try:
        return bool(list_pt_files(path))
    except FileNotFoundError:
        return False


def resolve_load_format(model_path: str, load_format: str = "auto") -> str:
    """The concrete format (`gguf`, `safetensors`, `pt` or `dummy`) for `model_path`; ValueError naming the path."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load format must be one of {list(LOAD_FORMATS)}, got {load_format!r}")
    if load_format == "dummy" or model_path.startswith(DUMMY_PREFIX):
        return "dummy"
    if not os.path.exists(model_path):
        raise ValueError(f"model path {model_path!r} does not exist")
    if load_format in ("auto", "gguf") and _is_gguf_file(model_path):
        return "gguf"
    if load_format in ("auto", "safetensors") and _has_safetensors(model_path):
        return "safetensors"
    if load_format in ("auto", "pt") and _has_pt(model_path):
        return "pt"
    expected = {
        "auto": "a .gguf file or a directory with *.safetensors or torch *.bin files",
        "gguf": "a .gguf file",
        "safetensors": "a directory with *.safetensors files",
        "pt": "a directory with torch *.bin files (pytorch_model.bin or its shards)",
    }[load_format]
    raise ValueError(f"cannot load {model_path!r} with load format {load_format!r}: expected {expected}")


def load_hf_config_dict(model_path: str, load_format: str = "auto") -> dict[str, Any]:
    """HF config dict: `config.json` of a directory, or built from GGUF metadata."""
    path = strip_dummy_prefix(model_path)
    if not os.path.exists(path):
        raise ValueError(f"model path {path!r} does not exist")
    if _is_gguf_file(path):
        from sglang.srt.model_loader.gguf_config import gguf_to_hf_config

        return gguf_to_hf_config(path)
    config_file = os.path.join(path, "config.json")
    if os.path.isfile(config_file):
        with open(config_file, encoding="utf-8") as f:
            return json.load(f)
    raise ValueError(f"no model config for {path!r}: expected a .gguf file or a directory with config.json")


def iter_weights(
    model_path: str, load_format: str = "auto", dtype: DtypeLike = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) pairs of the checkpoint at `model_path`, cast to `dtype` when given."""
    fmt = resolve_load_format(model_path, load_format)
    if fmt == "gguf":
        from sglang.srt.model_loader.gguf_weights import iter_gguf_weights

        return iter_gguf_weights(model_path, dtype)
    if fmt in ("safetensors", "pt"):
        torch_dtype = (
            None
            if dtype in (None, "auto")
            else (dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype))
        )
        reader = iter_safetensors_weights if fmt == "safetensors" else iter_pt_weights
        return reader(model_path, torch_dtype)
    raise ValueError(f"load format 'dummy' has no weights to iterate for {model_path!r}")


def load_model_weights(
    model: torch.nn.Module,
    model_path: str,
    load_format: str = "auto",
    dtype: DtypeLike = None,
    seed: Optional[int] = 0,
) -> str:
    """Fill `model` via `model.load_weights(...)` or dummy init; returns the format used."""
    fmt = resolve_load_format(model_path, load_format)
    if fmt == "dummy":
        init_dummy_weights(model, seed=0 if seed is None else seed)
    else:
        model.load_weights(iter_weights(model_path, fmt, dtype))
    return fmt
