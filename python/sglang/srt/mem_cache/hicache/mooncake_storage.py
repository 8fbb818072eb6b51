"""The L3 `mooncake` backend: KV pages in a Mooncake store shared by several servers and nodes.

A rank is one client of the store (`mooncake.store.MooncakeDistributedStore`, from the
`mooncake-transfer-engine` wheel): the `mooncake_master` keeps the directory of objects, the
clients' segments (`global_segment_size` each, ours or a store service's such as
`mooncake_client`) hold the bytes. Pages are named and framed as `page_store.py` describes; a
page's key is `sglkv-<namespace hash[:16]>-<name>`, so `clear()` removes one namespace's pages
(`remove_by_regex`) and every server of the same model and layout finds every other's pages.
A path's pages move in batches (`batch_is_exist`, `put_batch`, `get_batch`: `batch_pages` pages
per RPC, as many as the client's local buffer stages).

Failure is a miss, never an error: the master found unreachable (a TCP probe at most once a
second, or an RPC failure) counts `unreachable`, and for `retry_interval_s` every lookup is a miss
and every write is skipped (each counted as a read / write failure); then the master is probed
again (the client reconnects by itself to a master restarted at the same address; a client never
set up is set up then). The probe keeps a dead master from costing the client's multi-second RPC
timeout on each page. A page failing its checksum is counted, removed
(or, while the store's read lease holds it, overwritten by the next write) and recomputed.

Threads: the scheduler and the rank's prefetch I/O thread call one backend at once. The
connection state (the client, its setup, the probe and retry times, the pages that failed their
check) changes under one lock: one client is set up however many threads find none; the store
calls themselves run outside it (the client serves several threads), each inside `_use`, and
`close` waits for the calls in flight before it closes the client.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

from sglang.srt.mem_cache.hicache.mooncake_config import MooncakeConfig
from sglang.srt.mem_cache.hicache.page_store import PageStore, StorageStats, frame, unframe

logger = logging.getLogger(__name__)

PROBE_INTERVAL_S = 1.0  # a connected client's master is probed at most this often
PROBE_TIMEOUT_S = 0.5
RPC_FAIL = -900  # Mooncake's error code when the master does not answer
STAGED_PAGES = 4  # the client's local buffer holds at least this many storage pages
MAX_BATCH_PAGES = 64  # pages per batched read at most


@dataclass
class MooncakeStats(StorageStats):
    unreachable: int = 0  # times the master was found unreachable (the backend then skipped a while)


class MooncakeNotInstalled(RuntimeError):
    """The store client cannot be loaded: the server refuses to start (with the fix)."""


def store_class() -> Any:
    """Mooncake's store client class (the `pd` extra); `MooncakeNotInstalled` naming the fix."""
    os.environ.setdefault("GLOG_minloglevel", "1")  # mooncake logs every connection at INFO
    try:
        from mooncake.store import MooncakeDistributedStore
    except (ImportError, OSError) as err:
        from sglang.srt.disaggregation.mooncake.data_plane import PACKAGES_FIX, SYSTEM_FIX

        missing = isinstance(err, ModuleNotFoundError) and (err.name or "").split(".")[0] == "mooncake"
        raise MooncakeNotInstalled(
            f"--hicache-storage-backend mooncake: the Mooncake store client cannot be loaded "
            f"({type(err).__name__}: {err}). Fix: `{PACKAGES_FIX if missing else SYSTEM_FIX}` "
            "(in a checkout: `make setup-pd`)"
        ) from err
    return MooncakeDistributedStore


def connect_store(config: MooncakeConfig, local_buffer_size: int) -> Any:
    """A Mooncake store client set up with `config`; RuntimeError when setup fails."""
    store = store_class()()
    rc = store.setup(
        config.local_hostname,
        config.metadata_server,
        config.global_segment_size,
        local_buffer_size,
        config.protocol,
        config.device_name,
        config.master_server_address,
    )
    if rc != 0:
        raise RuntimeError(f"MooncakeDistributedStore.setup returned {rc}")
    return store


def master_reachable(config: MooncakeConfig) -> bool:
    try:
        socket.create_connection(config.master_host_port(), PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True


class MooncakeStorage(PageStore):
    """`page_bytes`: one storage page's payload (sizes the client's local buffer); `connect` and
    `probe` are Mooncake's client and a TCP connect to the master (tests replace them)."""

    def __init__(
        self,
        config: MooncakeConfig,
        namespace: str,
        page_size: int,
        page_bytes: int = 0,
        connect: Callable[[MooncakeConfig, int], Any] = connect_store,
        probe: Callable[[MooncakeConfig], bool] = master_reachable,
    ):
        super().__init__(namespace, page_size)
        self.config = config
        self.stats = MooncakeStats()
        self.prefix = f"sglkv-{self._seed.hex()[:16]}-"
        self.local_buffer_size = max(config.local_buffer_size, STAGED_PAGES * (page_bytes + 64))
        # pages per batched call: as many as the client's local buffer stages at once, its
        # allocator rounding each page up by as much as 1/8 (a batch of more fails past the fit)
        fit = self.local_buffer_size * 8 // (9 * (page_bytes + 64))
        self.batch_pages = max(1, min(MAX_BATCH_PAGES, fit))
        self._connect, self._probe = connect, probe
        self._store: Any = None
        self._probed = self._retry_at = float("-inf")
        self._bad: set[str] = set()  # names whose stored page failed its check (overwritten on put)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when the last call in flight ends
        self._in_flight = 0
        self._closed = False
        with self._use():
            pass  # join the store now where the master is up

    # ------------------------------------------------------------------ connection
    @contextmanager
    def _use(self) -> Iterator[Any]:
        """The client for one call (None: the master unreachable, or the backend closed); `close`
        waits until the calls holding it have ended."""
        with self._lock:
            store = None if self._closed else self._client()
            if store is not None:
                self._in_flight += 1
        try:
            yield store
        finally:
            if store is not None:
                with self._lock:
                    self._in_flight -= 1
                    if self._in_flight == 0:
                        self._idle.notify_all()

    def _client(self) -> Any:
        """The client, or None while the master is unreachable (probed again after a while); the
        caller holds the lock."""
        now = time.monotonic()
        if now < self._retry_at:
            return None
        if self._store is None:  # not set up yet: setup against a dead master blocks for minutes
            if not self._probe(self.config):
                return self._down("master unreachable")
            try:
                self._store = self._connect(self.config, self.local_buffer_size)
            except MooncakeNotInstalled:
                raise
            except Exception as e:  # noqa: BLE001 - any failure to join the store is a miss
                return self._down(f"cannot join the store ({e})")
            logger.info("HiCache mooncake storage: joined the store at %s", self.config.master_server_address)
        elif now - self._probed >= PROBE_INTERVAL_S and not self._probe(self.config):
            return self._down("master unreachable")
        self._probed = now
        return self._store

    def _down(self, why: str) -> None:
        """Skip the backend for `retry_interval_s` (the client reconnects to a master that comes
        back). Called with or without the lock: it only moves the retry time later."""
        self.stats.add("unreachable")
        logger.warning(
            "HiCache mooncake storage: %s (master %s); storage skipped for %.0f s (lookups recompute)",
            why,
            self.config.master_server_address,
            self.config.retry_interval_s,
        )
        self._retry_at = time.monotonic() + self.config.retry_interval_s
        return None

    def close(self, wait_s: float = 30.0) -> None:
        """No call starts after this; the client is closed once the calls in flight have ended
        (at most `wait_s`: a call hung past it keeps its client open)."""
        with self._lock:
            self._closed = True
            if not self._idle.wait_for(lambda: self._in_flight == 0, timeout=wait_s):
                logger.warning("HiCache mooncake storage: a store call still runs; the client stays open")
                return
            store, self._store = self._store, None
        if store is not None:
            store.close()

    # ------------------------------------------------------------------ pages
    def key(self, name: str) -> str:
        return self.prefix + name

    def exists(self, name: str) -> bool:
        with self._use() as store:
            if store is None or name in self._bad:
                return False
            rc = store.is_exist(self.key(name))
        if rc == RPC_FAIL:
            self._down(f"looking up page {name[:16]} failed")
        return rc == 1

    def put(self, name: str, payload: bytes) -> bool:
        with self._use() as store:
            if store is None:
                self.stats.add("write_failures")
                return False
            write = store.upsert if name in self._bad else store.put  # put leaves an existing page as is
            rc = write(self.key(name), frame(payload))
        if rc != 0:
            self.stats.add("write_failures")
            if rc == RPC_FAIL:
                self._down(f"writing page {name[:16]} failed ({rc})")
            else:
                logger.warning("HiCache mooncake storage: writing page %s failed (%d)", name[:16], rc)
            return False
        with self._lock:
            self._bad.discard(name)
        self.stats.add("pages_written")
        return True

    def put_many(self, names: Sequence[str], payloads: Sequence[bytes]) -> int:
        """One `put_batch` RPC per `batch_pages` pages (`upsert_batch` where a page failed its
        check); a batch the store refuses (a page already there, a full segment: which landed is
        not known) is written page by page. How many were written before the first failure."""
        written = 0
        for at in range(0, len(names), self.batch_pages):
            chunk, data = names[at : at + self.batch_pages], payloads[at : at + self.batch_pages]
            with self._use() as store:
                if store is None:
                    self.stats.add("write_failures")
                    return written
                write = store.upsert_batch if self._bad.intersection(chunk) else store.put_batch
                rc = write([self.key(n) for n in chunk], [frame(p) for p in data])
            if rc != 0:
                done = super().put_many(chunk, data)
                written += done
                if done < len(chunk):
                    return written
                continue
            with self._lock:
                self._bad.difference_update(chunk)
            self.stats.add("pages_written", len(chunk))
            written += len(chunk)
        return written

    def exists_many(self, names: Sequence[str]) -> list[bool]:
        """One `batch_is_exist` RPC for all of `names` (a page that failed its check counts as absent)."""
        with self._use() as store:
            if store is None or not names:
                return [False] * len(names)
            rcs = store.batch_is_exist([self.key(n) for n in names])
        if len(rcs) != len(names) or (min(rcs) < 0 and not self._probe(self.config)):
            self._down(f"looking up {len(names)} pages failed")
            return [False] * len(names)
        return [rc == 1 and n not in self._bad for n, rc in zip(names, rcs)]

    def get(self, name: str) -> Optional[bytes]:
        """The page's payload, or None: missing, unreadable, failed its check, or the store
        unreachable (all but a plain miss counted and logged)."""
        with self._use() as store:
            if store is None:
                self.stats.add("read_failures")
                return None
            return self._checked(store, name, store.get(self.key(name)))

    def get_run(self, names: Sequence[str]) -> list[bytes]:
        """The leading readable pages of `names`, `batch_pages` per `get_batch` RPC."""
        out: list[bytes] = []
        for at in range(0, len(names), self.batch_pages):
            chunk = names[at : at + self.batch_pages]
            with self._use() as store:
                if store is None:
                    self.stats.add("read_failures")
                    return out
                if not self._read_chunk(store, chunk, out):
                    return out
        return out

    def _read_chunk(self, store: Any, chunk: Sequence[str], out: list[bytes]) -> bool:
        """One `get_batch` of `chunk`, its readable leading pages appended to `out`; whether all were."""
        datas = store.get_batch([self.key(n) for n in chunk])
        for name, data in zip(chunk, datas):
            # a page the batch answered empty is asked once alone: one such page of a stored
            # prefix came back empty while `is_exist` said it was there (test_pd_hicache, once)
            data = data or store.get(self.key(name))
            payload = self._checked(store, name, data)
            if payload is None:
                return False
            out.append(payload)
        return len(datas) >= len(chunk)

    def _checked(self, store: Any, name: str, data: bytes) -> Optional[bytes]:
        """The payload of the page `data` read for `name`; None (counted and logged unless a plain
        miss) when there is none or it fails its check."""
        if not data:  # a miss, or a failure: the client answers both with no bytes
            if not self._probe(self.config):
                self.stats.add("read_failures")
                return self._down(f"reading page {name[:16]} failed")
            rc = store.is_exist(self.key(name))
            if rc == 0:
                return None  # a plain miss
            self.stats.add("read_failures")
            if rc == RPC_FAIL:
                return self._down(f"reading page {name[:16]} failed")
            logger.warning("HiCache mooncake storage: page %s unreadable (%d); recomputing", name[:16], rc)
            return None
        payload, why = unframe(data)
        if payload is None:
            self.stats.add("read_failures")
            with self._lock:
                self._bad.add(name)
            logger.warning("HiCache mooncake storage: page %s %s; recomputing", name[:16], why)
            store.remove(self.key(name))  # refused while the read lease holds: then overwritten
            return None
        self.stats.add("pages_read")
        return payload

    def clear(self) -> int:
        """Delete this namespace's pages (other models' and ranks' stay); returns how many. Pages
        read within the master's lease (`--default_kv_lease_ttl`) stay until it expires."""
        with self._lock:
            self._bad.clear()
        with self._use() as store:
            if store is None:
                return 0
            removed = store.remove_by_regex("^" + re.escape(self.prefix))
        if removed < 0:
            logger.warning("HiCache mooncake storage: clearing failed (%d)", removed)
            return 0
        return removed
