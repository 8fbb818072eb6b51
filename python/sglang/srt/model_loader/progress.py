"""tqdm progress bars of model loading (weight files, GGUF tensors): shown by rank 0 only, and only on
a terminal (tqdm's `disable=None`), so logs and the other ranks stay quiet."""

from __future__ import annotations

from typing import Iterable, Optional, TypeVar

T = TypeVar("T")


def is_rank0() -> bool:
    """True outside torch.distributed and on its global rank 0."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def progress(items: Iterable[T], desc: str, total: Optional[int] = None, unit: str = "it") -> Iterable[T]:
    """`items` wrapped in a tqdm bar on rank 0 when stderr is a terminal; `items` itself otherwise."""
    if not is_rank0():
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, total=total, unit=unit, disable=None, dynamic_ncols=True)
