"""The L3 `file` backend: one file per KV page in a directory (local or shared).

Pages are named and checksummed as `page_store.py` describes. A namespace's pages live under a
folder of its own (`<directory>/<namespace hash[:16]>/<name[:2]>/<name>.kv`), so `clear()` removes
one rank's pages and nobody else's. Each file is a framed page (`page_store.frame`), written to a
temporary name of the writer's own (process and thread) and renamed over the page atomically, so
servers or attention-DP replicas sharing a directory may write one page at the same time (the
bytes are equal: the name fixes the tokens and layout). A file that is missing, short or fails its
checksum, or a directory that is gone, reads as a miss (a bad page is logged, counted and
removed): the caller recomputes, and writes the page again. Nothing here raises on I/O errors.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from typing import Optional

from sglang.srt.mem_cache.hicache.page_store import PageStore, StorageStats, frame, unframe

__all__ = ["FileStorage", "StorageStats"]

logger = logging.getLogger(__name__)


class FileStorage(PageStore):
    def __init__(self, directory: str, namespace: str, page_size: int):
        super().__init__(namespace, page_size)
        self.directory = directory
        self.root = os.path.join(directory, self._seed.hex()[:16])  # this namespace's pages
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:
            logger.warning(
                "HiCache file storage: cannot create %s (%s); writes will be retried", directory, e
            )

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name[:2], name + ".kv")

    def exists(self, name: str) -> bool:
        return os.path.exists(self._path(name))

    def put(self, name: str, payload: bytes) -> bool:
        path = self._path(name)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # writers of one page never share a temp
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(frame(payload))
            os.replace(tmp, path)
        except OSError as e:
            self.stats.add("write_failures")
            logger.warning("HiCache file storage: writing page %s failed (%s)", name[:16], e)
            return False
        self.stats.add("pages_written")
        return True

    def get(self, name: str) -> Optional[bytes]:
        """The page's payload, or None (missing, or failed its check: counted and logged)."""
        path = self._path(name)
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
        return removed
