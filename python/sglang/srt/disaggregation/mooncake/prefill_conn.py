"""The prefill side of the Mooncake backend: `MooncakeKVSender` (one request on one rank) and
`MooncakePrefillKVManager` (the rank's recv thread and transfer threads)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from sglang.srt import envs
from sglang.srt.disaggregation.base.conn import (
    BaseKVSender,
    BasePrefillKVManager,
    KVManagerArgs,
    SuccessCallback,
)
from sglang.srt.disaggregation.base.kv_poll import KVPoll, TransferState
from sglang.srt.disaggregation.base.messages import FirstToken, PrefillRankInfo
from sglang.srt.disaggregation.mooncake.data_plane import DataPlane
from sglang.srt.disaggregation.mooncake.messages import (
    ChunkRecord,
    DecodeKVRequest,
    TransferComplete,
    TransferDone,
)
from sglang.srt.disaggregation.mooncake.transport import MooncakeKVManager
from sglang.srt.mem_cache.transfer_layout import KVRegion, copy_plan, slot_runs

logger = logging.getLogger(__name__)

EARLY_MESSAGE_TTL_S = 600.0  # messages about a room this rank has not seen yet are kept this long


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


class MooncakeKVSender(BaseKVSender):
    """One request on one prefill rank. Scheduler thread: `send` chunks, `finish`, `abort`, `poll`."""

    def __init__(self, mgr: "MooncakePrefillKVManager", room: int):
        self.mgr = mgr
        self.room = room
        self.state = TransferState(room)
        self.metas: dict[tuple[int, int], DecodeKVRequest] = {}  # by (decode tp rank, decode stage)
        self.expected_metas: Optional[int] = None
        self.completed: set[int] = set()  # decode tp ranks (stage 0's confirm for every stage)
        self.pending: list[Any] = []  # chunks handed over before every decode rank's request arrived
        self.records: list[ChunkRecord] = []
        self.nbytes = 0
        self.finished = False
        self.finished_at = 0.0
        self.failure_reported = False
        self.created = time.time()

    @property
    def transfers_kv(self) -> bool:
        return True

    # -------------------------------------------------------------- scheduler thread
    def poll(self) -> KVPoll:
        state = self.state.poll()
        if state == KVPoll.Bootstrapping and self.state.age_in(state) > self.mgr.timeouts.bootstrap_s:
            self.fail(
                f"the decode side sent no KV addresses within {self.mgr.timeouts.bootstrap_s:g} s "
                "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)"
            )
        elif self.finished and state in (KVPoll.WaitingForInput, KVPoll.Transferring):
            if time.monotonic() - self.finished_at > self.mgr.timeouts.waiting_s:
                self.fail(
                    f"the decode side did not confirm the KV within {self.mgr.timeouts.waiting_s:g} s "
                    "(SGLANG_DISAGGREGATION_WAITING_TIMEOUT)"
                )
        return self.state.poll()

    def send(self, positions: np.ndarray, src_slots: np.ndarray) -> None:
        if len(positions):
            self._submit(
                _Chunk(np.asarray(positions, np.int64), np.asarray(src_slots, np.int64), time.time())
            )

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

    def release(self) -> None:
        self.mgr.release(self)

    # -------------------------------------------------------------- any thread
    def _submit(self, task: Any) -> None:
        with self.mgr.lock:
            if self.expected_metas is None or len(self.metas) < self.expected_metas:
                self.pending.append(task)
                return
        self.mgr.enqueue(self, task)

    def add_meta(self, meta: DecodeKVRequest) -> None:
        """(recv thread, under the manager lock)"""
        self.metas[meta.key] = meta
        self.expected_metas = meta.decode_tp_size * meta.decode_pp_size
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


class MooncakePrefillKVManager(MooncakeKVManager, BasePrefillKVManager):
    def __init__(self, args: KVManagerArgs, data_plane: DataPlane):
        super().__init__(args, data_plane)
        self.senders: dict[int, MooncakeKVSender] = {}
        # Called on the recv thread when a room's transfer is confirmed by every decode rank
        # (which confirm only once every prefill rank has reported: the whole KV has landed).
        self.on_success: Optional[SuccessCallback] = None
        self.early_metas: dict[int, list[DecodeKVRequest]] = {}
        self.early_failures: dict[int, tuple[str, float]] = {}
        n = max(1, envs.SGLANG_DISAGGREGATION_QUEUE_SIZE.get())
        self.queues: list[queue.Queue] = [queue.Queue() for _ in range(n)]
        self.workers = [
            threading.Thread(target=self._worker, args=(q,), name=f"pd-transfer-{i}", daemon=True)
            for i, q in enumerate(self.queues)
        ]
        place = args.place
        self.rank_info = PrefillRankInfo(
            rank_ip=args.ip,
            rank_port=self.port,
            session_id=data_plane.session_id,
            tp_rank=place.tp_rank,
            tp_size=place.tp_size,
            cp_rank=place.cp_rank,
            cp_size=place.cp_size,
            pp_rank=place.pp_rank,
            pp_size=place.pp_size,
            dp_rank=place.dp_rank,
            dp_size=place.dp_size,
            kv_dtype=args.kv_dtype,
            page_size=args.page_size,
            kv_kind=args.kv_kind,
            start_layer=args.start_layer,
            end_layer=args.end_layer,
        )
        self.bootstrap_url = args.bootstrap_url

    def start(self) -> None:
        super().start()
        for w in self.workers:
            w.start()
        if self.bootstrap_url:
            self.bootstrap.register_rank(self.bootstrap_url, self.rank_info)

    @property
    def key(self) -> tuple[int, int, int, int]:
        return self.rank_info.key

    def set_success_callback(self, callback: SuccessCallback) -> None:
        self.on_success = callback

    def create_sender(self, room: int) -> MooncakeKVSender:
        sender = MooncakeKVSender(self, room)
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

    def release(self, sender: MooncakeKVSender) -> None:
        """The scheduler is done with the room (its KV is freed)."""
        with self.lock:
            self.senders.pop(sender.room, None)

    # -------------------------------------------------------------- recv thread
    def handle(self, msg: Any) -> None:
        if isinstance(msg, DecodeKVRequest):
            self._on_decode_request(msg)
        elif isinstance(msg, TransferComplete):
            self._on_complete(msg)
        else:
            logger.warning("PD prefill: unexpected message %s", type(msg).__name__)

    def _on_decode_request(self, msg: DecodeKVRequest) -> None:
        with self.lock:
            sender = self.senders.get(msg.room)
            if sender is None:
                self._expire_early()
                self.early_metas.setdefault(msg.room, []).append(msg)
                return
            sender.add_meta(msg)

    def _on_complete(self, msg: TransferComplete) -> None:
        with self.lock:
            sender = self.senders.get(msg.room)
            if sender is None and not msg.ok:
                known = msg.room in self.early_metas
                self.early_failures[msg.room] = (msg.error or "aborted on the decode server", time.time())
                metas = [m for m in self.early_metas.get(msg.room, []) if m.decode_rank == msg.decode_rank]
        if sender is None:
            if not msg.ok and known:  # nothing was written: acknowledge now (each decode stage's part)
                for meta in metas:
                    done = TransferDone(msg.room, self.key, False, "acknowledged", decode_key=meta.key)
                    self.outbox.send(meta.status_endpoint, done)
            return
        if msg.ok:
            sender.completed.add(msg.decode_rank)
            tp_size = next(iter(sender.metas.values())).decode_tp_size if sender.metas else None
            if tp_size is not None and len(sender.completed) >= tp_size:
                sender.state.advance_to_at_least(KVPoll.Success)
                if self.on_success is not None and sender.state.poll() == KVPoll.Success:
                    self.on_success(sender.room)
        else:
            sender.fail(f"decode side: {msg.error or 'aborted'}")

    def _expire_early(self) -> None:
        now = time.time()
        for room in [
            r for r, metas in self.early_metas.items() if now - metas[0].wall_time > EARLY_MESSAGE_TTL_S
        ]:
            del self.early_metas[room]
        for room in [r for r, (_, t) in self.early_failures.items() if now - t > EARLY_MESSAGE_TTL_S]:
            del self.early_failures[room]

    # -------------------------------------------------------------- transfer threads
    def enqueue(self, sender: MooncakeKVSender, task: Any) -> None:
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
                    self._report_done(sender, task.first_token)
            except Exception as err:  # noqa: BLE001 - a failed transfer fails its room only
                logger.exception("PD room %d: transfer failed", sender.room)
                sender.fail(f"KV transfer failed: {err}")

    def _write_chunk(self, sender: MooncakeKVSender, chunk: _Chunk) -> None:
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
                sender.fail(
                    f"KV transfer to decode rank {meta.decode_rank} ({meta.session_id}) failed (rc {rc})"
                )
                return
            nbytes += sum(lengths)
        sender.nbytes += nbytes
        sender.records.append(ChunkRecord(len(chunk.positions), nbytes, chunk.queued, started, time.time()))

    def _report_done(self, sender: MooncakeKVSender, first_token: Optional[FirstToken]) -> None:
        for meta in sender.metas.values():
            done = TransferDone(
                sender.room,
                self.key,
                True,
                first_token=first_token,
                chunks=list(sender.records),
                decode_key=meta.key,
            )
            if not self.outbox.send(meta.status_endpoint, done):
                sender.fail(f"cannot reach decode rank {meta.decode_rank}")
                break

    def _regions_for(self, meta: DecodeKVRequest) -> list[KVRegion]:
        """Rows every rank holds whole (MLA latent, DSA index keys) go to a decode rank from one
        prefill tp rank only; per-head buffers from every rank (each sends its heads)."""
        if meta.decode_rank % self.place.tp_size == self.place.tp_rank:
            return self.regions
        return [r for r in self.regions if r.kind in ("k", "v")]

    def _report_failure(self, sender: MooncakeKVSender, reason: str) -> None:
        if sender.failure_reported:
            return
        sender.failure_reported = True
        with self.lock:
            metas = list(sender.metas.values())
        for meta in metas:
            done = TransferDone(sender.room, self.key, False, reason, decode_key=meta.key)
            self.outbox.send(meta.status_endpoint, done)
