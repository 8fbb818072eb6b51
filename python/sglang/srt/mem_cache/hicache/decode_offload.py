"""A PD decode server's L3 writes (`--disaggregation-decode-enable-offload-kvcache`).

`OffloadingRadixCache` is the decode server's radix cache (a decode server matches no prefixes:
every prompt's KV arrives from the prefill server) which also writes, whenever a path is
inserted (a finished, aborted or retracted request's KV: prompt + output, page-aligned by the
caller), every storage page of that path that the backend lacks. The pages carry the names and
the namespace a prefill server's `HiRadixCache` looks up (hash chain of the tokens from the
first one, model identity, layout: factory.py), so the prefill server of a later turn (the
earlier prompt + its answer + new text) loads them and computes only the new suffix.

The writes are synchronous: the scheduler releases a finished request before it sends the
request's last output, so the pages are in the store before the client has the answer (a next
turn cannot race its own history). A failed write (a backend error, an unreachable master) is
logged and counted; the request is unaffected and the prefill side recomputes the missing pages.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.hicache.page_store import PageStore, write_missing
from sglang.srt.mem_cache.radix_cache import RadixCache

logger = logging.getLogger(__name__)


@dataclass
class OffloadStats:
    pages_written: int = 0  # storage pages this server wrote
    pages_present: int = 0  # pages the store already held (the prefill server's, or an earlier turn's)
    write_failures: int = 0  # pages that could not be written (recomputed by the prefill side)
    seconds: float = 0.0  # time spent packing and writing


class OffloadingRadixCache(RadixCache):
    """`pack(slots)`: a storage page's payload from this rank's KV rows of `slots`."""

    def __init__(
        self,
        allocator: TokenToKVPoolAllocator,
        page_size: int,
        storage: PageStore,
        pack: Callable[[torch.Tensor], bytes],
        agree: Optional[Callable[[int], int]] = None,
    ):
        super().__init__(allocator, page_size)
        self.storage = storage
        self.pack = pack
        self.agree = agree  # a collective over the ranks (tp / cp > 1): every rank cleared before the answer
        self.ostats = OffloadStats()

    def insert(self, key: Sequence[int], value: torch.Tensor) -> int:
        """Write the path's missing storage pages (while the caller's slots are valid), then insert."""
        t0 = time.perf_counter()
        try:
            self.offload(key, value)
        finally:
            self.ostats.seconds += time.perf_counter() - t0
        return super().insert(key, value)

    def offload(self, key: Sequence[int], value: torch.Tensor) -> int:
        """Write the storage pages of `key` (KV in `value`, one slot per token) the store lacks;
        returns how many were written. Never raises: a failure is a page the prefill recomputes."""
        sp = self.storage.page_size
        num_pages = min(len(key), value.numel()) // sp
        if num_pages == 0:
            return 0
        names = self.storage.page_hashes(key, num_pages)
        try:
            present = self.storage.exists_many(names)  # one call (Mooncake: one RPC) for the path
        except Exception as err:  # noqa: BLE001 - a backend's error must not fail the request
            logger.warning("HiCache decode offload: existence check failed (%s)", err)
            present = [False] * num_pages
        self.ostats.pages_present += sum(present)
        try:
            written, ok = write_missing(
                self.storage, names, present, lambda i: self.pack(value[i * sp : (i + 1) * sp])
            )
        except Exception as err:  # noqa: BLE001 - a backend's error must not fail the request
            logger.warning("HiCache decode offload: pages not written (%s)", err)
            written, ok = 0, False
        if not ok:  # the chain stops at the first page not written
            self.ostats.write_failures += 1
        self.ostats.pages_written += written
        return written

    def clear_storage(self) -> int:
        """Delete this rank's pages (`/clear_hicache_storage_backend`); returns how many."""
        return self.storage.clear()

    def stats(self) -> dict:
        out = {f"hicache_offload_{k}": v for k, v in asdict(self.ostats).items()}
        out.update({f"hicache_storage_{k}": v for k, v in self.storage.stats.snapshot().items()})
        return out
