"""Stream (name, tensor) pairs from an HF directory of *.safetensors files."""

from __future__ import annotations

import glob
import json
import os
from typing import Iterator, Optional

import torch
from safetensors import safe_open

from sglang.srt.model_loader.progress import progress

INDEX_NAME = "model.safetensors.index.json"


def list_safetensors_files(model_dir: str) -> list[str]:
    """The shard files of `model_dir`: those named by the index json when present, else every *.safetensors."""
    index_path = os.path.join(model_dir, INDEX_NAME)
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted({os.path.join(model_dir, v) for v in weight_map.values()})
        missing = [p for p in files if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"{index_path} names missing shard(s): {missing}")
        if files:
            return files
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir!r}")
    return files


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
                tensor = f.get_tensor(name)
                if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
                    tensor = tensor.to(dtype)
                yield name, tensor
