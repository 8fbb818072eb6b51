"""Stream (name, tensor) pairs from an HF directory of torch `.bin` checkpoints (`--load-format pt`):
`pytorch_model.bin`, or shards `pytorch_model-0000x-of-0000y.bin` named by `pytorch_model.bin.index.json`.

Each file is read with `torch.load(weights_only=True, mmap=True)`: tensors only (no pickled code
runs) and memory-mapped, so a shard is not copied into memory before its tensors are used.
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch

from sglang.srt.model_loader.model_files import list_pt_files
from sglang.srt.model_loader.progress import progress
from sglang.srt.model_loader.weight_files import cast_floating


def iter_pt_weights(
    model_dir: str, dtype: Optional[torch.dtype] = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield every tensor of every `.bin` file under its stored (HF) name, floating ones cast to `dtype`."""
    files = list_pt_files(model_dir)
    for path in progress(files, "Loading pt checkpoint shards", unit="file"):
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        for name, tensor in state.items():
            yield name, cast_floating(tensor, dtype, name)
        del state
