"""Stream (name, tensor) pairs from an HF directory of *.safetensors files."""

from __future__ import annotations

from typing import Iterator, Optional

import torch
from safetensors import safe_open

from sglang.srt.model_loader.progress import progress
from sglang.srt.model_loader.weight_files import cast_floating, list_weight_files

INDEX_NAME = "model.safetensors.index.json"


def list_safetensors_files(model_dir: str) -> list[str]:
    """The shard files of `model_dir`: those named by the index json when present, else every *.safetensors."""
    return list_weight_files(model_dir, INDEX_NAME, "*.safetensors")


def iter_safetensors_weights(
    model_dir: str, dtype: Optional[torch.dtype] = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield every tensor of every shard under its stored (HF) name, cast to `dtype` when given.

    Floating tensors only are cast; integer tensors (if any) keep their dtype.
    """
    files = list_safetensors_files(model_dir)
    for path in progress(files, "Loading safetensors checkpoint shards", unit="file"):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, cast_floating(f.get_tensor(name), dtype, name)
