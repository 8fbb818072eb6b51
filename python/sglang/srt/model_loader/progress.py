"""tqdm progress bars of model loading (weight files, GGUF tensors): shown by rank 0 only, and only on
a terminal (tqdm's `disable=None`), so logs and the other ranks stay quiet."""

from __future__ import annotations

import sys
import threading
from typing import Iterable, Optional, TypeVar

T = TypeVar("T")


def is_rank0() -> bool:
    """True outside torch.distributed and on its global rank 0."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def progress(items: Iterable[T], desc: str, total: Optional[int] = None, unit: str = "it") -> Iterable[T]:
    """`items` wrapped in a tqdm bar on rank 0 when stderr is a terminal; `items` itself otherwise."""
    if not is_rank0() or not sys.stderr.isatty():
        return items
    from tqdm.auto import tqdm

    # tqdm's default lock is a multiprocessing RLock (a named semaphore) even for a disabled bar; a
    # rank process ended by its parent never unlinks it, and the resource tracker then warns of a
    # leaked semaphore at the server's exit. Bars here are per process: a thread lock is enough.
    tqdm.set_lock(threading.RLock())
    return tqdm(items, desc=desc, total=total, unit=unit, disable=None, dynamic_ncols=True)
