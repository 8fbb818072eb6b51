"""Which files a model path holds, torch-free: the load format a path resolves to, its HF config
dict (config.json, or built from GGUF metadata) and the `.bin` shards of a torch checkpoint. The HTTP
process's start-up checks read these without importing torch; `loader.py` re-exports them."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from sglang.srt.model_loader.weight_files import list_weight_files

PT_INDEX_NAME = "pytorch_model.bin.index.json"
# torch .bin files of an HF directory that hold no model weights
_NOT_WEIGHTS = ("training_args.bin", "optimizer.bin", "scheduler.bin", "rng_state.bin")


def list_pt_files(model_dir: str) -> list[str]:
    """The `.bin` weight files of `model_dir`: those the index json names when present, else every *.bin."""
    return list_weight_files(model_dir, PT_INDEX_NAME, "*.bin", skip=_NOT_WEIGHTS)


LOAD_FORMATS = ("auto", "safetensors", "pt", "gguf", "dummy")
DUMMY_PREFIX = "dummy:"


def strip_dummy_prefix(model_path: str) -> str:
    """`dummy:<path>` -> `<path>`; other paths unchanged."""
    return model_path[len(DUMMY_PREFIX) :] if model_path.startswith(DUMMY_PREFIX) else model_path


def is_dummy_model(model_path: str, load_format: str) -> bool:
    """Random weights: `--load-format dummy`, or a path written `dummy:<path>`."""
    return load_format == "dummy" or model_path.startswith(DUMMY_PREFIX)


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
    if is_dummy_model(model_path, load_format):
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
