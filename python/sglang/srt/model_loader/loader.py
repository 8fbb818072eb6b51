"""Pick a load format for a model path, read its HF config, and fill a model's weights.

Formats: `gguf` (a .gguf file), `safetensors` (an HF directory with *.safetensors), `pt` (an HF
directory with torch `.bin` files), `dummy` (deterministic random weights; the config still comes
from the path). `auto` picks from the path: a .gguf file, else safetensors, else `.bin`.
A path written `dummy:<path>` means dummy weights with the config of `<path>`.
"""

from __future__ import annotations

from typing import Iterator, Optional, Union

import torch

from sglang.srt.model_loader.dummy_loader import init_dummy_weights
from sglang.srt.model_loader.model_files import (  # noqa: F401 - re-exported: the loader's interface
    DUMMY_PREFIX,
    LOAD_FORMATS,
    load_hf_config_dict,
    resolve_load_format,
    strip_dummy_prefix,
)
from sglang.srt.model_loader.pt_loader import iter_pt_weights
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights

DtypeLike = Union[torch.dtype, str, None]


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
