"""The decode side of the Mooncake backend: `MooncakeKVReceiver` (one request on one rank) and
`MooncakeDecodeKVManager` (the rank's recv thread, bootstrap lookups and heartbeat)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Optional

import numpy as np

from sglang.srt.disaggregation.base.conn import BaseDecodeKVManager, BaseKVReceiver, KVManagerArgs
from sglang.srt.disaggregation.base.kv_poll import KVPoll, TransferState
from sglang.srt.disaggregation.base.messages import FirstToken, PrefillTopology
from sglang.srt.disaggregation.mooncake.data_plane import DataPlane
from sglang.srt.disaggregation.mooncake.messages import (
    DecodeKVRequest,
    StageKVRequest,
    TransferComplete,
    TransferDone,
)
from sglang.srt.disaggregation.mooncake.transport import MooncakeKVManager

logger = logging.getLogger(__name__)


class MooncakeKVReceiver(BaseKVReceiver):
    """One request on one decode rank. Scheduler thread: `init`, `send_metadata`, `abort`, `poll`."""

    def __init__(self, mgr: "MooncakeDecodeKVManager", room: int, bootstrap_url: str):
        self.mgr = mgr
        self.room = room
        self.bootstrap_url = bootstrap_url
        self.state = TransferState(room)
        self.topology: Optional[PrefillTopology] = None
        self.dones: dict[tuple, TransferDone] = {}  # by (prefill rank key, decode stage key)
        self.acked: set[tuple] = set()  # (prefill rank, decode stage) pairs that will not write any more
        self.meta_sent = False
        self.first_token: Optional[FirstToken] = None
        self.failed_at: Optional[float] = None

    @property
    def transfers_kv(self) -> bool:
        return True

    def init(self) -> None:
        self.mgr.lookup(self)

    def poll(self) -> KVPoll:
        state = self.state.poll()
        t = self.mgr.timeouts
        if state == KVPoll.Bootstrapping and self.state.age_in(state) > t.bootstrap_s:
            self.fail(
                f"the prefill server at {self.bootstrap_url} was not ready within {t.bootstrap_s:g} s "
                "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)"
            )
        elif self.meta_sent and state in (KVPoll.WaitingForInput, KVPoll.Transferring):
            if self.state.age_in(KVPoll.WaitingForInput) > t.waiting_s:
                self.fail(
                    f"no KV from the prefill server at {self.bootstrap_url} within {t.waiting_s:g} s "
                    "(SGLANG_DISAGGREGATION_WAITING_TIMEOUT)"
                )
        return self.state.poll()

    @property
    def expected_parts(self) -> int:
        """TransferDones that make the room whole: one per prefill rank and decode stage."""
        return len(self.topology.ranks) * (1 + len(self.mgr.later_stages))

    def send_metadata(self, dst_slots: np.ndarray, row: int = -1) -> None:
        assert self.topology is not None, "send_metadata before the prefill ranks are known"
        mgr = self.mgr
        pp_size = 1 + len(mgr.later_stages)
        dst_slots = np.asarray(dst_slots, dtype=np.int64)
        stage = StageKVRequest(
            self.room,
            row,
            dst_slots,
            [r.endpoint for r in self.topology.ranks],
            mgr.endpoint,
            mgr.place.tp_size,
            pp_size,
            time.time(),
        )
        for address in mgr.later_stages:  # before any prefill rank can answer this stage's request
            if not mgr.outbox.send(address, stage):
                self.fail(f"cannot reach decode pipeline stage rank at {address}", notify=False)
                return
        req = DecodeKVRequest(
            room=self.room,
            decode_rank=mgr.place.tp_rank,
            decode_tp_size=mgr.place.tp_size,
            status_endpoint=mgr.endpoint,
            session_id=mgr.data_plane.session_id,
            dst_slots=dst_slots,
            regions=mgr.regions,
            kv_dtype=mgr.kv_dtype,
            wall_time=time.time(),
            decode_pp_size=pp_size,
        )
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
        if not self.meta_sent or self.topology is None:
            return True
        if self.state.poll() == KVPoll.Success:
            return True
        if len(self.acked) >= self.expected_parts or self.mgr.is_dead(self.bootstrap_url):
            return True
        return self.failed_at is not None and time.monotonic() - self.failed_at > self.mgr.timeouts.waiting_s

    def release(self) -> None:
        self.mgr.release(self)

    # -------------------------------------------------------------- recv thread
    def on_done(self, msg: TransferDone) -> None:
        part = (msg.prefill_key, msg.decode_key)
        self.acked.add(part)
        if not msg.ok:
            self.fail(f"the prefill server failed the transfer: {msg.error}", notify=False)
            return
        self.dones[part] = msg
        if msg.first_token is not None:
            self.first_token = msg.first_token
        if self.state.poll() == KVPoll.WaitingForInput:
            self.state.advance(KVPoll.Transferring)
        if self.topology is not None and len(self.dones) == self.expected_parts:
            if self.first_token is None:
                self.fail("the prefill server sent no first token")
                return
            self.state.advance(KVPoll.Success)
            ok = TransferComplete(self.room, self.mgr.place.tp_rank, True)
            for rank in self.topology.ranks:
                self.mgr.outbox.send(rank.endpoint, ok)


class MooncakeDecodeKVManager(MooncakeKVManager, BaseDecodeKVManager):
    def __init__(self, args: KVManagerArgs, data_plane: DataPlane):
        super().__init__(args, data_plane)
        self.receivers: dict[int, MooncakeKVReceiver] = {}
        self.topologies: dict[str, PrefillTopology] = {}
        self.failures: dict[str, int] = {}  # bootstrap url -> failed heartbeats in a row
        self.dead: set[str] = set()
        self.lookups: queue.Queue = queue.Queue()
        self.later_stages: list[str] = []  # stage 0: this tp rank on stages 1, 2, ... (decode pp)
        self.row_writer = None  # stage k > 0: mirrors a received prompt's req_to_token row
        self._lookup_thread = threading.Thread(target=self._lookup_loop, name="pd-bootstrap", daemon=True)
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name="pd-heartbeat", daemon=True
        )

    def start(self) -> None:
        super().start()
        self._lookup_thread.start()
        self._heartbeat_thread.start()

    def create_receiver(self, room: int, bootstrap_url: str) -> MooncakeKVReceiver:
        recv = MooncakeKVReceiver(self, room, bootstrap_url)
        with self.lock:
            if room in self.receivers:
                raise ValueError(f"bootstrap_room {room} is already in use on this decode server")
            self.receivers[room] = recv
        return recv

    def stage_address(self) -> Optional[str]:
        return self.endpoint

    def set_later_stages(self, addresses: list[Optional[str]]) -> None:
        self.later_stages = [a for a in addresses if a is not None]

    def set_row_writer(self, writer) -> None:
        self.row_writer = writer

    def release(self, recv: MooncakeKVReceiver) -> None:
        with self.lock:
            self.receivers.pop(recv.room, None)

    def is_dead(self, url: str) -> bool:
        return url in self.dead

    def lookup(self, recv: MooncakeKVReceiver) -> None:
        topo = self.topologies.get(recv.bootstrap_url)
        if topo is not None and recv.bootstrap_url not in self.dead:
            self._bootstrapped(recv, topo)
        else:
            self.lookups.put(recv)

    def _bootstrapped(self, recv: MooncakeKVReceiver, topo: PrefillTopology) -> None:
        first = topo.first
        if first.kv_dtype != self.kv_dtype:
            recv.fail(
                f"the prefill server caches KV in {first.kv_dtype}, this decode server in {self.kv_dtype}"
            )
            return
        recv.topology = topo
        if recv.state.poll() == KVPoll.Bootstrapping:
            recv.state.advance(KVPoll.WaitingForInput)

    def _lookup_loop(self) -> None:
        while not self.closed:
            recv = self.lookups.get()
            while recv.state.poll() == KVPoll.Bootstrapping and not self.closed:
                topo = self.topologies.get(recv.bootstrap_url) or self.bootstrap.query_topology(
                    recv.bootstrap_url
                )
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
                if self.bootstrap.is_alive(url):
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
                recv.fail(
                    f"the prefill server at {url} is unreachable (heartbeat failed "
                    f"{self.timeouts.heartbeat_max_failure} times)",
                    notify=False,
                )

    def _on_stage_request(self, msg: StageKVRequest) -> None:
        """(stage k > 0) Mirror the row, then ask every prefill rank for this stage's layers."""
        if self.row_writer is not None and msg.row >= 0:
            self.row_writer(msg.row, msg.dst_slots)
        req = DecodeKVRequest(
            room=msg.room,
            decode_rank=self.place.tp_rank,
            decode_tp_size=msg.decode_tp_size,
            status_endpoint=msg.status_endpoint,
            session_id=self.data_plane.session_id,
            dst_slots=msg.dst_slots,
            regions=self.regions,
            kv_dtype=self.kv_dtype,
            wall_time=msg.wall_time,
            decode_pp_rank=self.place.pp_rank,
            decode_pp_size=msg.decode_pp_size,
        )
        for endpoint in msg.prefill_endpoints:
            self.outbox.send(endpoint, req)

    def handle(self, msg: Any) -> None:
        if isinstance(msg, StageKVRequest):
            self._on_stage_request(msg)
        elif isinstance(msg, TransferDone):
            with self.lock:
                recv = self.receivers.get(msg.room)
            if recv is not None:
                recv.on_done(msg)
        else:
            logger.warning("PD decode: unexpected message %s", type(msg).__name__)
