"""HiCache's L2 -> L1 loads, layer by layer, beside the forward (issue 31: "so the forward can start
on loaded layers").

Admission restores a request's host-tier prefix into the KV pool. `LayerLoader` does that copy on
a thread of its own, one layer at a time (its K and V rows, or MLA's latent and indexer rows), in
the order the jobs were submitted. The KV pool's per-layer accessors call `wait(layer)` (the pool's
layer gate, `KVPool.attach_layer_gate`): an access to layer i returns once every job submitted so
far has copied layer i, so the forward computes layer 0 while layer 1 is still being copied.

Everything else that touches the copied rows waits for every job (`synchronize`): the host pool
does so before any other copy, pack, unpack or free of its rows (`HostKVPool`), so a host row is
never reused while a job still reads it, and a device row written later by a forward is written
after the job's copy of that layer (the forward's own access waited for it). A copy that fails
leaves the KV of its rows unknown: every later `wait` raises instead of serving it.

On an accelerator (`platform.async_copies`: pinned host memory) `StreamLoader` does the same with
the device's own means: each job's copies are queued on a copy stream, after the work already on
the compute stream, with an event recorded after each layer; `wait(layer)` makes the compute
stream wait for that layer's last event (the host does not block), `synchronize` blocks the host
until the last job's last layer is copied.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Optional, Protocol

import torch

logger = logging.getLogger(__name__)

# copy(src buffers, src rows, dst buffers, dst rows): one layer's buffers
CopyRows = Callable[[list[torch.Tensor], torch.Tensor, list[torch.Tensor], torch.Tensor], None]


class Loader(Protocol):
    """What the host pool and the KV pool's layer gate need of a loader."""

    busy_seconds: float

    def submit(
        self, src: list[torch.Tensor], src_rows: torch.Tensor, dst: list[torch.Tensor], dst_rows: torch.Tensor
    ) -> None: ...

    def wait(self, layer: int) -> None: ...

    def synchronize(self) -> None: ...

    def close(self) -> None: ...


def layer_groups(num_buffers: int, layer_num: int) -> list[list[int]]:
    """The buffer indices of each layer in `kv_token_buffers` order (the per-layer lists of the
    pool one after the other: K then V, or latent then indexer keys)."""
    if layer_num < 1 or num_buffers % layer_num:
        raise ValueError(f"{num_buffers} KV buffers do not split into {layer_num} layers")
    per = num_buffers // layer_num
    return [[i + k * layer_num for k in range(per)] for i in range(layer_num)]


class LayerLoader:
    """One thread copying rows layer by layer; `wait(layer)` / `synchronize()` for the readers."""

    def __init__(self, layers: list[list[int]], copy: CopyRows):
        self.layers, self.copy = layers, copy
        self._cond = threading.Condition()
        self._submitted = 0  # jobs submitted (only the owning scheduler thread submits)
        self._done = [0] * len(layers)  # jobs that have copied each layer
        self._error: Optional[str] = None
        self._queue: queue.Queue = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self.busy_seconds = 0.0  # time the thread spent copying

    def submit(
        self, src: list[torch.Tensor], src_rows: torch.Tensor, dst: list[torch.Tensor], dst_rows: torch.Tensor
    ) -> None:
        """Copy rows `src_rows` of every buffer of `src` to rows `dst_rows` of `dst`, in the background."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hicache-layer-load", daemon=True)
            self._thread.start()
        with self._cond:
            self._submitted += 1
        self._queue.put((src, src_rows, dst, dst_rows))

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            src, src_rows, dst, dst_rows = job
            t0 = time.perf_counter()
            for layer, idx in enumerate(self.layers):
                if self._error is None:
                    try:
                        self.copy([src[j] for j in idx], src_rows, [dst[j] for j in idx], dst_rows)
                    except Exception as e:  # noqa: BLE001 - reported to every reader
                        logger.exception("HiCache: layer %d of a load failed", layer)
                        self._error = f"layer {layer}: {e!r}"
                with self._cond:
                    self._done[layer] += 1
                    self._cond.notify_all()
            self.busy_seconds += time.perf_counter() - t0

    def wait(self, layer: int) -> None:
        """Return once every job submitted so far has copied `layer` (local index)."""
        if self._done[layer] < self._submitted:  # (ints read whole; `_done` only grows)
            with self._cond:
                while self._done[layer] < self._submitted:
                    self._cond.wait()
        if self._error is not None:
            raise RuntimeError(f"HiCache: a layer-by-layer KV load failed ({self._error}); KV unknown")

    def synchronize(self) -> None:
        """Return once every job submitted so far is done (its last layer copied)."""
        if self.layers:
            self.wait(len(self.layers) - 1)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


class StreamLoader:
    """An accelerator's layer-by-layer loads: copy-stream jobs, an event per layer (`platform`:
    streams and events, `platforms/base.py`)."""

    def __init__(self, layers: list[list[int]], copy: CopyRows, platform: Any):
        self.layers, self.copy, self.platform = layers, copy, platform
        self.stream = platform.new_stream()
        self.events: list[Any] = [None] * len(layers)  # each layer's last copy (None: none pending)
        self.busy_seconds = 0.0  # host time spent queuing the copies

    def submit(
        self, src: list[torch.Tensor], src_rows: torch.Tensor, dst: list[torch.Tensor], dst_rows: torch.Tensor
    ) -> None:
        t0 = time.perf_counter()
        self.stream.wait_stream(self.platform.current_stream())  # the rows' earlier users first
        with self.platform.stream(self.stream):
            for layer, idx in enumerate(self.layers):
                self.copy([src[j] for j in idx], src_rows, [dst[j] for j in idx], dst_rows)
                event = self.platform.new_event()
                event.record(self.stream)
                self.events[layer] = event
        self.busy_seconds += time.perf_counter() - t0

    def wait(self, layer: int) -> None:
        """The compute stream waits for the layer's copies (the host goes on)."""
        event = self.events[layer]
        if event is None:
            return
        if event.query():  # done: no more waits to queue for it
            self.events[layer] = None
            return
        self.platform.current_stream().wait_event(event)

    def synchronize(self) -> None:
        """The host waits for every copy queued so far (host rows about to be reused)."""
        if self.events and self.events[-1] is not None:
            self.events[-1].synchronize()

    def close(self) -> None:
        self.synchronize()
