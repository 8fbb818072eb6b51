"""Warming the KV pool's first slots in the background after start-up.

On CPU the pool is an anonymous map whose pages are committed on first write
(platforms/host_memory.py): a fast start and RAM only as the cache fills, but every slot written
for the first time pays a page fault (a 2048-token SmolLM2 prefill: 24 ms of 477 in its KV
writes). The allocator hands out the lowest free pages first, so a daemon thread commits slots
[1, n) lowest first, in rounds over every buffer, up to SGLANG_CPU_KV_PREFAULT_GB
(`madvise(MADV_POPULATE_WRITE)`: contents unchanged, so it may run while requests already write).
Accelerator pools are allocated eagerly and have nothing to warm (`Platform.page_populator` None).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

import torch

logger = logging.getLogger(__name__)

Populate = Callable[[torch.Tensor, int, int], bool]
ROUND_SLOTS = 4096  # slots warmed per round, over every buffer


class KVWarmer:
    def __init__(self, pool, populate: Populate, max_bytes: int, round_slots: int = ROUND_SLOTS) -> None:
        self.pool = pool
        self.populate = populate
        per_slot = max(1, pool.slot_bytes())
        self.slots = min(pool.size + pool.page_size, max_bytes // per_slot)
        self.round_slots = round_slots
        self.warmed = 0  # slots [0, warmed) are committed
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def run(self) -> None:
        """Warm every round (in the calling thread); stops early when the platform cannot."""
        start = time.perf_counter()
        while self.warmed < self.slots and not self._stop.is_set():
            hi = min(self.slots, self.warmed + self.round_slots)
            if not all(self.populate(*r) for r in self.pool.warm_ranges(self.warmed, hi)):
                logger.info("KV pool warming stopped: this kernel cannot populate pages ahead of use")
                return
            self.warmed = hi
        logger.info(
            "warmed KV slots [0, %d) (%.0f MiB) in %.2f s",
            self.warmed,
            self.warmed * self.pool.slot_bytes() / 2**20,
            time.perf_counter() - start,
        )

    def start(self) -> "KVWarmer":
        self._thread = threading.Thread(target=self.run, name="kv-warm", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: Optional[float] = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


def start_kv_warmer(pool, populate: Optional[Populate], max_gb: float) -> Optional[KVWarmer]:
    """A running warmer for `pool`, or None (nothing to populate, budget 0, or a pool without
    buffer ranges)."""
    if populate is None or max_gb <= 0 or not hasattr(pool, "warm_ranges"):
        return None
    return KVWarmer(pool, populate, int(max_gb * 2**30)).start()
