"""The transfer manager of one rank and its per-request endpoints (`KVSender` on the prefill
side, `KVReceiver` on the decode side).

Control messages travel over ZMQ (messages.py); KV bytes over the data plane (Mooncake). Each
manager owns one PULL socket read by one receiver thread; the prefill manager also owns the
transfer threads (a room always goes to the same thread, so its chunks and its final report stay
in order). The scheduler thread only calls `send` / `finish` / `abort` and reads `poll()`;
threads advance the `TransferState`.

Protocol (one request, "room"):
 1. decode rank: look the prefill ranks up at the bootstrap server, pre-allocate KV, send
    `DecodeKVRequest` (slots + buffer addresses) to every prefill rank;
 2. prefill rank: WaitingForInput once every decode rank's request is in; after each chunk's
    forward, write that chunk's page runs into the decode ranks' slots; after the last chunk and
    the first token, report `TransferDone` (the entry rank adds the first token);
 3. decode rank: Success once every prefill rank reported; it answers `TransferComplete(ok)` and
    the prefill ranks may free their KV (Success there).
Failures: any side fails the room and tells the other (`TransferDone(ok=False)` /
`TransferComplete(ok=False)`). A prefill rank acknowledges a decode-side failure only after its
last write of that room, so the decode side frees its slots only when nothing can still land in
them (`KVReceiver.drained`); a dead prefill server (heartbeat) counts as drained.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import requests
import zmq

from sglang.srt import envs
from sglang.srt.disaggregation.bootstrap import is_alive, query_topology, register_rank
from sglang.srt.disaggregation.kv_poll import KVPoll, TransferState
from sglang.srt.disaggregation.messages import (
    ChunkRecord,
    DecodeKVRequest,
    FirstToken,
    PrefillRankInfo,
    PrefillTopology,
    TransferComplete,
    TransferDone,
)
from sglang.srt.mem_cache.transfer_layout import KVRegion, copy_plan, slot_runs

logger = logging.getLogger(__name__)

RECV_POLL_MS = 100
EARLY_MESSAGE_TTL_S = 600.0  # messages about a room this rank has not seen yet are kept this long


@dataclass(frozen=True)
class RankPlace:
    """This rank's coordinates (explicit parallel state)."""

    tp_rank: int = 0
    tp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    dp_rank: int = 0
    dp_size: int = 1

    @property
    def is_entry(self) -> bool:
        return self.tp_rank == 0 and self.pp_rank == 0 and self.cp_rank == 0


@dataclass(frozen=True)
class Timeouts:
    bootstrap_s: float
    waiting_s: float
    heartbeat_s: float
    heartbeat_max_failure: int

    @staticmethod
    def from_env() -> "Timeouts":
        return Timeouts(
            envs.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.get(),
            envs.SGLANG_DISAGGREGATION_WAITING_TIMEOUT.get(),
            envs.SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL.get(),
            envs.SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE.get(),
        )

    @property
    def dead_after_s(self) -> float:
        return self.heartbeat_s * (self.heartbeat_max_failure + 1)


class _Outbox:
    """PUSH sockets to peers, shared by threads (ZMQ sockets are not thread-safe: one lock)."""

    def __init__(self, context: zmq.Context):
        self.context = context
        self.lock = threading.Lock()
        self.sockets: dict[str, zmq.Socket] = {}

    def send(self, endpoint: str, msg: Any) -> bool:
        with self.lock:
            sock = self.sockets.get(endpoint)
            if sock is None:
                sock = self.context.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 100000)
                sock.connect(endpoint)
                self.sockets[endpoint] = sock
            try:
                sock.send_pyobj(msg, zmq.NOBLOCK)
                return True
            except zmq.ZMQError as err:
                logger.warning("could not send %s to %s: %s", type(msg).__name__, endpoint, err)
                return False

    def close(self) -> None:
        with self.lock:
            for s in self.sockets.values():
                s.close(0)
            self.sockets.clear()


class KVManagerBase:
    """What both sides share: the data plane, the PULL socket and its thread, the outbox."""

    def __init__(self, place: RankPlace, ip: str, regions: list[KVRegion], data_plane, kv_dtype: str):
        self.place = place
        self.ip = ip
        self.regions = regions
        self.data_plane = data_plane
        self.kv_dtype = kv_dtype
        self.timeouts = Timeouts.from_env()
        self.context = zmq.Context(1)
        self.inbox = self.context.socket(zmq.PULL)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.port = self.inbox.bind_to_random_port(f"tcp://{ip}")
        self.endpoint = f"tcp://{ip}:{self.port}"
        self.outbox = _Outbox(self.context)
        self.lock = threading.Lock()
        self.closed = False
        self._recv_thread = threading.Thread(target=self._recv_loop, name="pd-recv", daemon=True)

    def start(self) -> None:
        self._recv_thread.start()

    def _recv_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.inbox, zmq.POLLIN)
        while not self.closed:
            try:
                if not poller.poll(RECV_POLL_MS):
                    continue
                msg = self.inbox.recv_pyobj(zmq.NOBLOCK)
            except zmq.ZMQError:
                if self.closed:
                    return
                continue
            try:
                self.handle(msg)
            except Exception:  # noqa: BLE001 - one bad message must not stop the thread
                logger.exception("PD: failed to handle %s", type(msg).__name__)

    def handle(self, msg: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True
        self.outbox.close()


# ============================================================================ prefill side
@dataclass
class _Chunk:
    positions: np.ndarray
    src_slots: np.ndarray
    queued: float


@dataclass
class _Finish:
    first_token: Optional[FirstToken]


@dataclass
class _FailureReport:
    """Tell the decode ranks this room failed here (after any write of the room)."""

    reason: str


class KVSender:
    """One request on one prefill rank. Scheduler thread: `send` chunks, `finish`, `abort`, `poll`."""

    def __init__(self, mgr: "PrefillKVManager", room: int):
        self.mgr = mgr
        self.room = room
        self.state = TransferState(room)
        self.metas: dict[int, DecodeKVRequest] = {}
        self.expected_metas: Optional[int] = None
        self.completed: set[int] = set()
        self.pending: list[Any] = []  # chunks handed over before every decode rank's request arrived
        self.records: list[ChunkRecord] = []
        self.nbytes = 0
        self.finished = False
        self.finished_at = 0.0
        self.failure_reported = False
        self.created = time.time()

    # -------------------------------------------------------------- scheduler thread
    def poll(self) -> KVPoll:
        state = self.state.poll()
        if state == KVPoll.Bootstrapping and self.state.age_in(state) > self.mgr.timeouts.bootstrap_s:
            self.fail(f"the decode side sent no KV addresses within {self.mgr.timeouts.bootstrap_s:g} s "
                      "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)")  # fmt: skip
        elif self.finished and state in (KVPoll.WaitingForInput, KVPoll.Transferring):
            if time.monotonic() - self.finished_at > self.mgr.timeouts.waiting_s:
                self.fail(f"the decode side did not confirm the KV within {self.mgr.timeouts.waiting_s:g} s "
                          "(SGLANG_DISAGGREGATION_WAITING_TIMEOUT)")  # fmt: skip
        return self.state.poll()

    def send(self, positions: np.ndarray, src_slots: np.ndarray) -> None:
        """Hand over the KV of token `positions` (stored in this rank's `src_slots`)."""
        if len(positions):
            self._submit(_Chunk(np.asarray(positions, np.int64), np.asarray(src_slots, np.int64), time.time()))

    def finish(self, first_token: Optional[FirstToken]) -> None:
        """The last chunk was handed over (and the first token sampled): report when written."""
        self.finished = True
        self.finished_at = time.monotonic()
        self._submit(_Finish(first_token))

    def abort(self, reason: str = "aborted on the prefill server") -> None:
        self.fail(reason)

    def failure_exception(self) -> Optional[str]:
        return self.state.reason

    def transfer_metric(self) -> dict:
        return {"room": self.room, "bytes": self.nbytes, "chunks": [r.__dict__ for r in self.records]}

    # -------------------------------------------------------------- any thread
    def _submit(self, task: Any) -> None:
        with self.mgr.lock:
            if self.expected_metas is None or len(self.metas) < self.expected_metas:
                self.pending.append(task)
                return
        self.mgr.enqueue(self, task)

    def add_meta(self, meta: DecodeKVRequest) -> None:
        """(recv thread, under the manager lock)"""
        self.metas[meta.decode_rank] = meta
        self.expected_metas = meta.decode_tp_size
        if len(self.metas) == self.expected_metas:
            if self.state.poll() == KVPoll.Bootstrapping:
                self.state.advance(KVPoll.WaitingForInput)
            pending, self.pending = self.pending, []
            for task in pending:
                self.mgr.enqueue(self, task)

    def fail(self, reason: str) -> None:
        if self.state.fail(reason):
            logger.warning("PD room %d failed on prefill rank %s: %s", self.room, self.mgr.place, reason)
            self.mgr.enqueue(self, _FailureReport(reason))


class PrefillKVManager(KVManagerBase):
    def __init__(self, place, ip, regions, data_plane, kv_dtype, info: dict, bootstrap_url: Optional[str]):
        super().__init__(place, ip, regions, data_plane, kv_dtype)
        self.senders: dict[int, KVSender] = {}
        # Called on the recv thread when a room's transfer is confirmed by every decode rank
        # (which confirm only once every prefill rank has reported: the whole KV has landed).
        self.on_success: Optional[Callable[[int], None]] = None
        self.early_metas: dict[int, list[DecodeKVRequest]] = {}
        self.early_failures: dict[int, tuple[str, float]] = {}
        n = max(1, envs.SGLANG_DISAGGREGATION_QUEUE_SIZE.get())
        self.queues: list[queue.Queue] = [queue.Queue() for _ in range(n)]
        self.workers = [
            threading.Thread(target=self._worker, args=(q,), name=f"pd-transfer-{i}", daemon=True)
            for i, q in enumerate(self.queues)
        ]
        self.rank_info = PrefillRankInfo(
            rank_ip=ip, rank_port=self.port, session_id=getattr(data_plane, "session_id", ""),
            tp_rank=place.tp_rank, tp_size=place.tp_size, cp_rank=place.cp_rank, cp_size=place.cp_size,
            pp_rank=place.pp_rank, pp_size=place.pp_size, dp_rank=place.dp_rank, dp_size=place.dp_size,
            kv_dtype=kv_dtype, **info,
        )  # fmt: skip
        self.bootstrap_url = bootstrap_url

    def start(self) -> None:
        super().start()
        for w in self.workers:
            w.start()
        if self.bootstrap_url is not None:
            register_rank(self.bootstrap_url, self.rank_info)

    @property
    def key(self) -> tuple[int, int, int, int]:
        return self.rank_info.key

    def create_sender(self, room: int) -> KVSender:
        sender = KVSender(self, room)
        with self.lock:
            if room in self.senders:
                raise ValueError(f"bootstrap_room {room} is already in use on this prefill server")
            self.senders[room] = sender
            for meta in self.early_metas.pop(room, []):
                sender.add_meta(meta)
            failure = self.early_failures.pop(room, None)
        if failure is not None:
            sender.fail(failure[0])
        return sender

    def release(self, sender: KVSender) -> None:
        """The scheduler is done with the room (its KV is freed)."""
        with self.lock:
            self.senders.pop(sender.room, None)

    # -------------------------------------------------------------- recv thread
    def handle(self, msg: Any) -> None:
        if isinstance(msg, DecodeKVRequest):
            with self.lock:
                sender = self.senders.get(msg.room)
                if sender is None:
                    self._expire_early()
                    self.early_metas.setdefault(msg.room, []).append(msg)
                    return
                sender.add_meta(msg)
        elif isinstance(msg, TransferComplete):
            with self.lock:
                sender = self.senders.get(msg.room)
                if sender is None and not msg.ok:
                    known = msg.room in self.early_metas
                    self.early_failures[msg.room] = (msg.error or "aborted on the decode server", time.time())
                    meta = next((m for m in self.early_metas.get(msg.room, []) if m.decode_rank == msg.decode_rank), None)
            if sender is None:
                if not msg.ok and known and meta is not None:  # nothing was written: acknowledge now
                    self.outbox.send(meta.status_endpoint, TransferDone(msg.room, self.key, False, "acknowledged"))
                return
            if msg.ok:
                sender.completed.add(msg.decode_rank)
                if sender.expected_metas is not None and len(sender.completed) >= sender.expected_metas:
                    sender.state.advance_to_at_least(KVPoll.Success)
                    if self.on_success is not None and sender.state.poll() == KVPoll.Success:
                        self.on_success(sender.room)
            else:
                sender.fail(f"decode side: {msg.error or 'aborted'}")
        else:
            logger.warning("PD prefill: unexpected message %s", type(msg).__name__)

    def _expire_early(self) -> None:
        now = time.time()
        for room in [r for r, metas in self.early_metas.items() if now - metas[0].wall_time > EARLY_MESSAGE_TTL_S]:
            del self.early_metas[room]
        for room in [r for r, (_, t) in self.early_failures.items() if now - t > EARLY_MESSAGE_TTL_S]:
            del self.early_failures[room]

    # -------------------------------------------------------------- transfer threads
    def enqueue(self, sender: KVSender, task: Any) -> None:
        self.queues[sender.room % len(self.queues)].put((sender, task))

    def _worker(self, q: queue.Queue) -> None:
        while not self.closed:
            sender, task = q.get()
            try:
                if isinstance(task, _FailureReport):
                    self._report_failure(sender, task.reason)
                elif sender.state.poll() == KVPoll.Failed:
                    continue
                elif isinstance(task, _Chunk):
                    self._write_chunk(sender, task)
                elif isinstance(task, _Finish):
                    for meta in sender.metas.values():
                        done = TransferDone(sender.room, self.key, True, first_token=task.first_token,
                                            chunks=list(sender.records))  # fmt: skip
                        if not self.outbox.send(meta.status_endpoint, done):
                            sender.fail(f"cannot reach decode rank {meta.decode_rank}")
                            break
            except Exception as err:  # noqa: BLE001 - a failed transfer fails its room only
                logger.exception("PD room %d: transfer failed", sender.room)
                sender.fail(f"KV transfer failed: {err}")

    def _write_chunk(self, sender: KVSender, chunk: _Chunk) -> None:
        if sender.state.poll() == KVPoll.WaitingForInput:
            sender.state.advance(KVPoll.Transferring)
        started = time.time()
        nbytes = 0
        for meta in sender.metas.values():
            regions = self._regions_for(meta)
            dst = meta.dst_slots[chunk.positions]
            runs = slot_runs(chunk.src_slots, dst)
            src_addrs, dst_addrs, lengths = copy_plan(regions, meta.regions, runs)
            if not src_addrs:
                continue
            rc = self.data_plane.write(meta.session_id, src_addrs, dst_addrs, lengths)
            if rc != 0:
                sender.fail(f"KV transfer to decode rank {meta.decode_rank} ({meta.session_id}) failed (rc {rc})")
                return
            nbytes += sum(lengths)
        sender.nbytes += nbytes
        sender.records.append(ChunkRecord(len(chunk.positions), nbytes, chunk.queued, started, time.time()))

    def _regions_for(self, meta: DecodeKVRequest) -> list[KVRegion]:
        """Rows every rank holds whole (MLA latent, DSA index keys) go to a decode rank from one
        prefill tp rank only; per-head buffers from every rank (each sends its heads)."""
        if meta.decode_rank % self.place.tp_size == self.place.tp_rank:
            return self.regions
        return [r for r in self.regions if r.kind in ("k", "v")]

    def _report_failure(self, sender: KVSender, reason: str) -> None:
        if sender.failure_reported:
            return
        sender.failure_reported = True
        with self.lock:
            metas = list(sender.metas.values())
        for meta in metas:
            self.outbox.send(meta.status_endpoint, TransferDone(sender.room, self.key, False, reason))


# ============================================================================ decode side
class KVReceiver:
    """One request on one decode rank. Scheduler thread: `init`, `send_metadata`, `abort`, `poll`."""

    def __init__(self, mgr: "DecodeKVManager", room: int, bootstrap_url: str):
        self.mgr = mgr
        self.room = room
        self.bootstrap_url = bootstrap_url
        self.state = TransferState(room)
        self.topology: Optional[PrefillTopology] = None
        self.dones: dict[tuple, TransferDone] = {}
        self.acked: set[tuple] = set()  # prefill ranks that will not write any more
        self.meta_sent = False
        self.first_token: Optional[FirstToken] = None
        self.failed_at: Optional[float] = None

    def init(self) -> None:
        self.mgr.lookup(self)

    def poll(self) -> KVPoll:
        state = self.state.poll()
        t = self.mgr.timeouts
        if state == KVPoll.Bootstrapping and self.state.age_in(state) > t.bootstrap_s:
            self.fail(f"the prefill server at {self.bootstrap_url} was not ready within {t.bootstrap_s:g} s "
                      "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)")  # fmt: skip
        elif self.meta_sent and state in (KVPoll.WaitingForInput, KVPoll.Transferring):
            if self.state.age_in(KVPoll.WaitingForInput) > t.waiting_s:
                self.fail(f"no KV from the prefill server at {self.bootstrap_url} within {t.waiting_s:g} s "
                          "(SGLANG_DISAGGREGATION_WAITING_TIMEOUT)")  # fmt: skip
        return self.state.poll()

    def send_metadata(self, dst_slots: np.ndarray) -> None:
        """Tell every prefill rank where this rank's KV of the prompt goes."""
        assert self.topology is not None, "send_metadata before the prefill ranks are known"
        mgr = self.mgr
        req = DecodeKVRequest(
            room=self.room, decode_rank=mgr.place.tp_rank, decode_tp_size=mgr.place.tp_size,
            status_endpoint=mgr.endpoint, session_id=getattr(mgr.data_plane, "session_id", ""),
            dst_slots=np.asarray(dst_slots, dtype=np.int64), regions=mgr.regions, kv_dtype=mgr.kv_dtype,
            wall_time=time.time(),
        )  # fmt: skip
        self.meta_sent = True
        for rank in self.topology.ranks:
            if not mgr.outbox.send(rank.endpoint, req):
                self.fail(f"cannot reach prefill rank {rank.key} at {rank.endpoint}")
                return

    def abort(self, reason: str = "aborted on the decode server") -> None:
        self.fail(reason)

    def fail(self, reason: str, notify: bool = True) -> None:
        if not self.state.fail(reason):
            return
        self.failed_at = time.monotonic()
        logger.warning("PD room %d failed on decode rank %d: %s", self.room, self.mgr.place.tp_rank, reason)
        if notify and self.meta_sent and self.topology is not None:
            msg = TransferComplete(self.room, self.mgr.place.tp_rank, False, reason)
            for rank in self.topology.ranks:
                self.mgr.outbox.send(rank.endpoint, msg)

    def failure_exception(self) -> Optional[str]:
        return self.state.reason

    @property
    def drained(self) -> bool:
        """No prefill rank can still write into this rank's slots of the room."""
        if not self.meta_sent or self.topology is None:
            return True
        if self.state.poll() == KVPoll.Success:
            return True
        if len(self.acked) >= len(self.topology.ranks) or self.mgr.is_dead(self.bootstrap_url):
            return True
        return self.failed_at is not None and time.monotonic() - self.failed_at > self.mgr.timeouts.waiting_s

    # -------------------------------------------------------------- recv thread
    def on_done(self, msg: TransferDone) -> None:
        self.acked.add(msg.prefill_key)
        if not msg.ok:
            self.fail(f"the prefill server failed the transfer: {msg.error}", notify=False)
            return
        self.dones[msg.prefill_key] = msg
        if msg.first_token is not None:
            self.first_token = msg.first_token
        if self.state.poll() == KVPoll.WaitingForInput:
            self.state.advance(KVPoll.Transferring)
        if self.topology is not None and len(self.dones) == len(self.topology.ranks):
            if self.first_token is None:
                self.fail("the prefill server sent no first token")
                return
            self.state.advance(KVPoll.Success)
            ok = TransferComplete(self.room, self.mgr.place.tp_rank, True)
            for rank in self.topology.ranks:
                self.mgr.outbox.send(rank.endpoint, ok)


class DecodeKVManager(KVManagerBase):
    def __init__(self, place, ip, regions, data_plane, kv_dtype):
        super().__init__(place, ip, regions, data_plane, kv_dtype)
        self.receivers: dict[int, KVReceiver] = {}
        self.topologies: dict[str, PrefillTopology] = {}
        self.failures: dict[str, int] = {}  # bootstrap url -> failed heartbeats in a row
        self.dead: set[str] = set()
        self.lookups: queue.Queue = queue.Queue()
        self._lookup_thread = threading.Thread(target=self._lookup_loop, name="pd-bootstrap", daemon=True)
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="pd-heartbeat", daemon=True)

    def start(self) -> None:
        super().start()
        self._lookup_thread.start()
        self._heartbeat_thread.start()

    def create_receiver(self, room: int, bootstrap_url: str) -> KVReceiver:
        recv = KVReceiver(self, room, bootstrap_url)
        with self.lock:
            if room in self.receivers:
                raise ValueError(f"bootstrap_room {room} is already in use on this decode server")
            self.receivers[room] = recv
        return recv

    def release(self, recv: KVReceiver) -> None:
        with self.lock:
            self.receivers.pop(recv.room, None)

    def is_dead(self, url: str) -> bool:
        return url in self.dead

    def lookup(self, recv: KVReceiver) -> None:
        topo = self.topologies.get(recv.bootstrap_url)
        if topo is not None and recv.bootstrap_url not in self.dead:
            self._bootstrapped(recv, topo)
        else:
            self.lookups.put(recv)

    def _bootstrapped(self, recv: KVReceiver, topo: PrefillTopology) -> None:
        first = topo.first
        if first.kv_dtype != self.kv_dtype:
            recv.fail(f"the prefill server caches KV in {first.kv_dtype}, this decode server in {self.kv_dtype}")
            return
        recv.topology = topo
        if recv.state.poll() == KVPoll.Bootstrapping:
            recv.state.advance(KVPoll.WaitingForInput)

    def _lookup_loop(self) -> None:
        while not self.closed:
            recv = self.lookups.get()
            while recv.state.poll() == KVPoll.Bootstrapping and not self.closed:
                try:
                    topo = self.topologies.get(recv.bootstrap_url) or query_topology(recv.bootstrap_url)
                except requests.RequestException:
                    topo = None
                if topo is not None:
                    self.topologies[recv.bootstrap_url] = topo
                    self.dead.discard(recv.bootstrap_url)
                    self.failures.pop(recv.bootstrap_url, None)
                    self._bootstrapped(recv, topo)
                    break
                recv.poll()  # applies the bootstrap timeout
                time.sleep(0.2)

    def _heartbeat_loop(self) -> None:
        while not self.closed:
            time.sleep(self.timeouts.heartbeat_s)
            with self.lock:
                urls = {r.bootstrap_url for r in self.receivers.values()} | set(self.topologies)
            for url in urls:
                if is_alive(url):
                    self.failures.pop(url, None)
                    self.dead.discard(url)
                    continue
                self.failures[url] = self.failures.get(url, 0) + 1
                if self.failures[url] >= self.timeouts.heartbeat_max_failure:
                    self._mark_dead(url)

    def _mark_dead(self, url: str) -> None:
        if url not in self.dead:
            logger.error("PD: the prefill server at %s stopped answering its bootstrap health check", url)
        self.dead.add(url)
        self.topologies.pop(url, None)
        with self.lock:
            victims = [r for r in self.receivers.values() if r.bootstrap_url == url]
        for recv in victims:
            if recv.state.poll() not in (KVPoll.Success, KVPoll.Failed):
                recv.fail(f"the prefill server at {url} is unreachable (heartbeat failed "
                          f"{self.timeouts.heartbeat_max_failure} times)", notify=False)  # fmt: skip

    def handle(self, msg: Any) -> None:
        if isinstance(msg, TransferDone):
            with self.lock:
                recv = self.receivers.get(msg.room)
            if recv is not None:
                recv.on_done(msg)
        else:
            logger.warning("PD decode: unexpected message %s", type(msg).__name__)


TransferCallback = Callable[[int], None]
