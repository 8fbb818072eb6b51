"""The L3 `file` backend: one file per KV page in a directory (local or shared).

Pages are named and checksummed as `page_store.py` describes. A namespace's pages live under a
folder of its own (`<directory>/<namespace hash[:16]>/<name[:2]>/<name>.kv`), so `clear()` removes
one rank's pages and nobody else's. Each file is a framed page (`page_store.frame`), written to a
temporary name of the writer's own (process and thread) and renamed over the page atomically, so
servers or attention-DP replicas sharing a directory may write one page at the same time (the
bytes are equal: the name fixes the tokens and layout). A file that is missing, short or fails its
checksum, or a directory that is gone, reads as a miss (a bad page is logged, counted and
removed): the caller recomputes, and writes the page again. Nothing here raises on I/O errors.

Bounds (the extra config's keys, upstream's names; `FileLimits`): `capacity_gb` caps the bytes of
this namespace's page files, least recently used (written or read) removed first; `ttl_seconds`
makes a page older than that (by its file's time) a miss, removed when found. Both count
`pages_evicted`. The capacity holds for the pages this backend wrote or found at start: servers
sharing a directory each keep their own under it; a page removed under another's read is a miss
there (recomputed).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

from sglang.srt.mem_cache.hicache.page_store import PageStore, StorageStats, frame_header, unframe

__all__ = ["FileLimits", "FileStorage", "FileStats", "StorageStats"]

logger = logging.getLogger(__name__)


@dataclass
class FileStats(StorageStats):
    pages_evicted: int = 0  # removed by the capacity or the time-to-live


@dataclass(frozen=True)
class FileLimits:
    capacity_bytes: Optional[int] = None
    ttl_s: Optional[float] = None

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> "FileLimits":
        """`capacity_gb` (> 0) and `ttl_seconds` (>= 0; 0: none) of the extra config; ValueError naming
        the key."""
        cap, ttl = extra.get("capacity_gb"), extra.get("ttl_seconds")
        for key, v, bound in (("capacity_gb", cap, "> 0"), ("ttl_seconds", ttl, ">= 0")):
            number = isinstance(v, (int, float)) and not isinstance(v, bool)
            if v is not None and not (number and (v > 0 or (v == 0 and key == "ttl_seconds"))):
                raise ValueError(
                    f"--hicache-storage-backend-extra-config {key} must be a number {bound}, got {v!r}"
                )
        return cls(None if cap is None else int(cap * 1e9), ttl or None)


class FileStorage(PageStore):
    def __init__(self, directory: str, namespace: str, page_size: int, limits: FileLimits = FileLimits()):
        super().__init__(namespace, page_size)
        self.stats = FileStats()
        self.directory = directory
        self.root = os.path.join(directory, self._seed.hex()[:16])  # this namespace's pages
        self.limits = limits
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, int] = OrderedDict()  # page name -> file bytes, oldest first
        self._used = 0
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:
            logger.warning(
                "HiCache file storage: cannot create %s (%s); writes will be retried", directory, e
            )
        if limits.capacity_bytes is not None:
            self._scan()

    def _scan(self) -> None:
        """The pages already in the namespace folder, least recently used first (file times)."""
        found = []
        for folder, _, files in os.walk(self.root):
            for f in files:
                if f.endswith(".kv"):
                    try:
                        st = os.stat(os.path.join(folder, f))
                    except OSError:
                        continue
                    found.append((max(st.st_atime, st.st_mtime), f[:-3], st.st_size))
        for _, name, size in sorted(found):
            self._lru[name] = size
            self._used += size
        self._evict()

    def _touch(self, name: str, size: Optional[int] = None) -> None:
        """`name` used now (`size`: written, with its file's bytes); then evict past the capacity."""
        if self.limits.capacity_bytes is None:
            return
        with self._lock:
            if size is not None:
                self._used += size - self._lru.get(name, 0)
                self._lru[name] = size
            if name in self._lru:
                self._lru.move_to_end(name)
        self._evict()

    def _evict(self) -> None:
        """Remove the least recently used pages until the folder is within the capacity (the page
        used last stays, even alone over it)."""
        while True:
            with self._lock:
                if self._used <= self.limits.capacity_bytes or len(self._lru) <= 1:
                    return
                name, size = self._lru.popitem(last=False)
                self._used -= size
            self._remove(name)

    def _remove(self, name: str) -> None:
        try:
            os.remove(self._path(name))
        except OSError:
            pass
        self.stats.add("pages_evicted")

    def _expired(self, name: str) -> bool:
        """Whether the page's file is older than the time-to-live (then it is removed)."""
        if self.limits.ttl_s is None:
            return False
        try:
            age = time.time() - os.stat(self._path(name)).st_mtime
        except OSError:
            return False
        if age <= self.limits.ttl_s:
            return False
        with self._lock:
            self._used -= self._lru.pop(name, 0)
        self._remove(name)
        return True

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name[:2], name + ".kv")

    def exists(self, name: str) -> bool:
        return os.path.exists(self._path(name)) and not self._expired(name)

    def put(self, name: str, payload: bytes) -> bool:
        path = self._path(name)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # writers of one page never share a temp
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            head = frame_header(payload)  # written before the payload: no framed copy of the page
            with open(tmp, "wb") as f:
                f.write(head)
                f.write(payload)
            os.replace(tmp, path)
        except OSError as e:
            self.stats.add("write_failures")
            logger.warning("HiCache file storage: writing page %s failed (%s)", name[:16], e)
            return False
        self.stats.add("pages_written")
        self._touch(name, len(head) + len(payload))
        return True

    def get(self, name: str) -> Optional[bytes]:
        """The page's payload, or None (missing, or failed its check: counted and logged)."""
        path = self._path(name)
        if self._expired(name):
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            return self._failed(name, f"unreadable ({e})")
        payload, why = unframe(data)
        if payload is None:
            return self._failed(name, why)
        self.stats.add("pages_read")
        self._touch(name)
        return payload

    def _failed(self, name: str, why: str) -> None:
        """Count and log a bad page and remove it (the recomputed KV is written again)."""
        self.stats.add("read_failures")
        logger.warning("HiCache file storage: page %s %s; recomputing", name[:16], why)
        try:
            os.remove(self._path(name))
        except OSError:
            pass
        return None

    def clear(self) -> int:
        """Delete this namespace's pages (other models' and ranks' stay); returns how many."""
        removed = sum(1 for _, _, files in os.walk(self.root) for f in files if f.endswith(".kv"))
        shutil.rmtree(self.root, ignore_errors=True)
        with self._lock:
            self._lru.clear()
            self._used = 0
        return removed
