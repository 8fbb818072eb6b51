"""What the checkpoint readers of an HF directory share: which weight files to read (those an index
json names, else every file of the format), and the cast of floating tensors to the load dtype."""

from __future__ import annotations

import glob
import json
import os
from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:  # torch-free at import: the HTTP process resolves load formats with this module
    import torch


def list_weight_files(model_dir: str, index_name: str, pattern: str, skip: Sequence[str] = ()) -> list[str]:
    """The weight files of `model_dir`: those named by the index json `index_name` when present,
    else every file matching `pattern` (except the names in `skip`). FileNotFoundError when none."""
    index_path = os.path.join(model_dir, index_name)
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted({os.path.join(model_dir, v) for v in weight_map.values()})
        missing = [p for p in files if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"{index_path} names missing shard(s): {missing}")
        if files:
            return files
    files = sorted(p for p in glob.glob(os.path.join(model_dir, pattern)) if os.path.basename(p) not in skip)
    if not files:
        raise FileNotFoundError(f"no {pattern} weight files in {model_dir!r}")
    return files


def cast_floating(tensor: "torch.Tensor", dtype: "Optional[torch.dtype]", name: str = "") -> "torch.Tensor":
    """`tensor` in `dtype` when it is a floating tensor (integer tensors keep theirs); None: unchanged.
    Quantized checkpoints keep their FP8 weights (1 byte) and scales (FP8 `*_scale_inv`, int8
    `*.weight_scale`) as stored (a 1-byte floating tensor is one of torch's FP8 dtypes)."""
    if dtype is None or not tensor.is_floating_point() or tensor.dtype == dtype:
        return tensor
    if tensor.element_size() == 1 or name.endswith(("_scale_inv", ".weight_scale")):
        return tensor
    return tensor.to(dtype)
