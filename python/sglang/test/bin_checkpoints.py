"""Torch `.bin` copies of a safetensors checkpoint directory, as older HF checkpoints are saved
(`pytorch_model.bin`, or `pytorch_model-0000x-of-0000y.bin` shards with `pytorch_model.bin.index.json`)."""

from __future__ import annotations

import glob
import json
import os
import shutil

import torch
from safetensors.torch import load_file


def safetensors_to_bin(src_dir: str, out_dir: str, shards: int = 1) -> str:
    """Copy `src_dir` to `out_dir` with its weights as torch `.bin` file(s) instead of safetensors."""
    os.makedirs(out_dir, exist_ok=True)
    state: dict[str, torch.Tensor] = {}
    for name in os.listdir(src_dir):
        path = os.path.join(src_dir, name)
        if name.endswith(".safetensors"):
            state.update(load_file(path))
        elif os.path.isfile(path) and not name.endswith(".safetensors.index.json"):
            shutil.copyfile(path, os.path.join(out_dir, name))
    names = sorted(state)
    if shards == 1:
        torch.save(state, os.path.join(out_dir, "pytorch_model.bin"))
        return out_dir
    weight_map = {}
    for i in range(shards):
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = {n: state[n] for n in names[i::shards]}
        torch.save(part, os.path.join(out_dir, file))
        weight_map.update({n: file for n in part})
    with open(os.path.join(out_dir, "pytorch_model.bin.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
    assert not glob.glob(os.path.join(out_dir, "*.safetensors"))
    return out_dir
