"""What the L3 storage backends share: page names and the checksummed page format.

A page's name is the hash chain of the tokens up to and including it, seeded with a namespace
(model identity and layout: tp rank/size, pp stage, cp rank, dtype, page size, buffer shapes), so
servers of another model or layout never read it. A stored page is `MAGIC + sha256(payload) +
payload`; `unframe` gives the payload back, or None with the reason it is rejected. A backend
(`FileStorage`, `MooncakeStorage`) is a `PageStore` with `exists`, `put`, `get` and `clear`; the
batch forms `exists_many`, `get_run` and `put_many` loop over them unless a backend has batch calls
(Mooncake: `batch_pages` pages per call); `write_missing` writes a path's missing pages with them.
A backend is called from the scheduler thread and from the prefetch I/O thread at once: its
counters (`StorageStats`) move only under their lock, and `thread_failures` tells a caller the
failures its own thread met (what the other thread meets meanwhile is not its call's).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, fields
from typing import Callable, Iterator, Optional, Sequence

MAGIC = b"SGLKV1\n"
_DIGEST = 32


FAILURES = ("read_failures", "unreachable")  # what `thread_failures` tallies


@dataclass
class StorageStats:
    """A backend's counters. Both the scheduler thread and the prefetch I/O thread move them, so
    they change only through `add` (under a lock) and are read whole through `snapshot`."""

    pages_written: int = 0
    pages_read: int = 0
    read_failures: int = 0  # checksum, short page, unreadable, backend unreachable: recomputed
    write_failures: int = 0

    def __post_init__(self):
        self._lock = threading.Lock()
        self._mine = threading.local()  # the calling thread's own failures (`thread_failures`)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)
        if name in FAILURES:
            self._mine.failures = getattr(self._mine, "failures", 0) + n

    def thread_failures(self) -> int:
        """The failures (read failures, unreachable backend) met by the calling thread so far: a
        before/after difference tells what that thread's own calls met, whatever the other does."""
        return getattr(self._mine, "failures", 0)

    def snapshot(self) -> dict:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self)}


def frame_header(payload: bytes) -> bytes:
    """What a stored page holds before its payload: the magic and the payload's sha256."""
    return MAGIC + hashlib.sha256(payload).digest()


def frame(payload: bytes) -> bytes:
    """A page as stored: a header, the payload's sha256, the payload."""
    return frame_header(payload) + payload


def unframe(data: bytes) -> tuple[Optional[memoryview], str]:
    """(the payload, "") of a stored page, or (None, why it is rejected); the payload is a view
    of `data` (no copy of a page's megabytes)."""
    head = len(MAGIC) + _DIGEST
    if len(data) < head or not data.startswith(MAGIC):
        return None, "bad header"
    payload = memoryview(data)[head:]
    if hashlib.sha256(payload).digest() != data[len(MAGIC) : head]:
        return None, "checksum mismatch"
    return payload, ""


class PageStore:
    """Names of a namespace's pages of `page_size` tokens, and the backend's counters."""

    batch_pages = 1  # pages a batched call moves at once (payloads packed per batch by write_missing)

    def __init__(self, namespace: str, page_size: int):
        self.namespace = namespace
        self.page_size = page_size
        self._seed = hashlib.sha256(namespace.encode()).digest()
        self.stats = StorageStats()

    def exists(self, name: str) -> bool:
        raise NotImplementedError

    def get(self, name: str) -> Optional[bytes]:
        raise NotImplementedError

    def put(self, name: str, payload: bytes) -> bool:
        raise NotImplementedError

    def put_many(self, names: Sequence[str], payloads: Sequence[bytes]) -> int:
        """Write the pages in order; how many were written before the first failure."""
        for i, (name, payload) in enumerate(zip(names, payloads)):
            if not self.put(name, payload):
                return i
        return len(names)

    def exists_many(self, names: Sequence[str]) -> list[bool]:
        """Which of `names` the backend holds."""
        return [self.exists(n) for n in names]

    def get_run(self, names: Sequence[str]) -> list[bytes]:
        """The payloads of the leading pages of `names` that can be read (up to the first miss or
        failure: a hash chain is unreadable past a hole)."""
        out: list[bytes] = []
        for name in names:
            data = self.get(name)
            if data is None:
                break
            out.append(data)
        return out

    def page_hashes(self, tokens: Sequence[int], num_pages: int) -> list[str]:
        """Names of the first `num_pages` pages of `tokens` (each chained on the previous)."""
        return list(self.iter_page_hashes(tokens, num_pages))

    def iter_page_hashes(self, tokens: Sequence[int], num_pages: int) -> Iterator[str]:
        """`page_hashes`, one page at a time (a caller may stop early)."""
        prev, ps = self._seed, self.page_size
        for i in range(num_pages):
            page = ",".join(str(int(t)) for t in tokens[i * ps : (i + 1) * ps]).encode()
            prev = hashlib.sha256(prev + page).digest()
            yield prev.hex()


def write_missing(
    storage: PageStore, names: Sequence[str], present: Sequence[bool], pack: Callable[[int], bytes]
) -> tuple[int, bool]:
    """Write the pages of `names` not `present` (`pack(i)`: page i's payload), `batch_pages` at a
    time, stopping at the first failure (a chain is unreadable past a hole): (written, all ok)."""
    missing = [i for i, here in enumerate(present) if not here]
    written = 0
    for at in range(0, len(missing), storage.batch_pages):
        chunk = missing[at : at + storage.batch_pages]
        done = storage.put_many([names[i] for i in chunk], [pack(i) for i in chunk])
        written += done
        if done < len(chunk):
            return written, False
    return written, True
