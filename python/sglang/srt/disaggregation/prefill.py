"""The prefill server's side of PD: a component the scheduler holds.

Queues of a request here: **bootstrap** (its sender waits for the decode side's KV addresses;
nothing is allocated) -> the scheduler's waiting / running lists (normal chunked prefill; after
each forward `after_forward` hands the chunk's new KV to the sender, page-aligned, so the
transfer overlaps the next chunk) -> **inflight** (first token sampled: `take_over` sends it and
the request leaves `running`; its KV stays until the decode side confirms) -> finished (KV
released into the radix cache) or failed (released too, the client gets an abort with the reason).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Optional

import numpy as np

from sglang.srt.disaggregation.base.conn import BaseKVSender, BasePrefillKVManager
from sglang.srt.disaggregation.base.kv_poll import KVPoll
from sglang.srt.disaggregation.base.messages import FirstToken
from sglang.srt.disaggregation.first_token import first_token_of
from sglang.srt.disaggregation.common import agree, own_shard, rank_place
from sglang.srt.disaggregation.component import HELD, Admission, Disaggregation, Moves, OutputSink
from sglang.srt.disaggregation.messages import FAKE_BOOTSTRAP_HOST
from sglang.srt.managers.scheduler.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.scheduler.scheduler_output import build_token_id_out

logger = logging.getLogger(__name__)

RECENT_TRANSFERS = 64  # transfer records kept for internal_state (tests, benchmarks)


@dataclass
class _Entry:
    req: Req
    sender: BaseKVSender
    sent: int = 0  # prompt positions handed to the sender
    taken_over: bool = False  # first token sampled, the last chunk handed over
    answered: bool = False  # its finished output went to the detokenizer (early or by `step`)


class PrefillDisaggregation(Disaggregation):
    """`manager`: the transfer backend's (factory.py); `local_manager`: the fake backend's, for
    requests served without a peer (bootstrap host FAKE_BOOTSTRAP_HOST)."""

    def __init__(
        self, groups, runner, cache, manager: BasePrefillKVManager, local_manager: BasePrefillKVManager
    ):
        self.groups = groups
        self.cache = cache
        self.req_to_token = runner.req_to_token_pool.req_to_token
        self.page = runner.kv_page_size
        self.cp_mapping = runner.cp.mapping if runner.cp is not None else None
        self.place = rank_place(groups)
        self.manager = manager
        self.local_manager = local_manager
        self.entries: dict[str, _Entry] = {}
        self.by_room: dict[int, _Entry] = {}  # rooms that move KV (the recv thread's early answers)
        self.answer_lock = threading.Lock()  # `answered` is decided by one thread
        self.output_sink: Optional[OutputSink] = None
        self.num_early_answers = 0
        self.bootstrap_queue: list[_Entry] = []
        self.inflight: list[_Entry] = []
        self.recent: deque = deque(maxlen=RECENT_TRANSFERS)
        self.num_failed = 0

    # ------------------------------------------------------------------ admission
    def admit(self, req: Req, recv) -> Admission:
        """Take a new request into the bootstrap queue, or refuse it."""
        room, host = recv.bootstrap_room, recv.bootstrap_host
        if room is None or host is None:
            return Admission(
                error="this server runs --disaggregation-mode prefill: a request needs bootstrap_host, "
                "bootstrap_port and bootstrap_room (send it through sglang-router)"
            )
        manager = self.local_manager if host == FAKE_BOOTSTRAP_HOST else self.manager
        try:
            sender = manager.create_sender(room)
        except ValueError as err:
            return Admission(error=str(err))
        entry = _Entry(req, sender)
        self.entries[req.rid] = entry
        if sender.transfers_kv:
            self.by_room[sender.room] = entry
        self.bootstrap_queue.append(entry)
        return HELD

    # ------------------------------------------------------------------ each scheduler step
    def step(self, running: list[Req]) -> Moves:
        """Requests ready to prefill (to the scheduler's waiting list); requests finished or failed
        here (KV released, reason set)."""
        ready: list[Req] = []
        done: list[Req] = []
        if self.bootstrap_queue:
            polls = agree(self.groups.replica, [int(e.sender.poll()) for e in self.bootstrap_queue])
            keep = []
            for entry, poll in zip(self.bootstrap_queue, polls):
                if poll == KVPoll.Failed:
                    self._fail(entry, done, release=False)
                elif poll >= KVPoll.WaitingForInput:
                    ready.append(entry.req)
                else:
                    keep.append(entry)
            self.bootstrap_queue = keep
        if self.inflight:
            polls = agree(self.groups.replica, [int(e.sender.poll()) for e in self.inflight])
            keep = []
            for entry, poll in zip(self.inflight, polls):
                if poll == KVPoll.Success:
                    self._forget(entry)
                    self.cache.release(entry.req)
                    self.recent.append(entry.sender.transfer_metric())
                    with self.answer_lock:
                        if entry.answered:  # the recv thread already answered the client
                            continue
                        entry.answered = True
                        entry.req.finished_reason = {"type": "length", "length": len(entry.req.output_ids)}
                    done.append(entry.req)
                elif poll == KVPoll.Failed:
                    self._fail(entry, done, release=True)
                else:
                    keep.append(entry)
            self.inflight = keep
        return Moves(to_waiting=ready, finished=done)

    def rooms_of(self, batch: ScheduleBatch) -> list:
        """The bootstrap room of each item (None: not a PD request); [] when there is none."""
        senders = [
            self.entries[it.req.rid].sender if it.req.rid in self.entries else None for it in batch.items
        ]
        rooms = [s.room if s is not None and s.transfers_kv else None for s in senders]
        return rooms if any(r is not None for r in rooms) else []

    def after_forward(self, batch: ScheduleBatch) -> None:
        """Hand every PD request's newly computed KV (whole pages; all of it on its last chunk)
        to its sender: the transfer runs while the next chunk computes."""
        for item in batch.items:
            entry = self.entries.get(item.req.rid)
            if entry is None or entry.req.finished:
                continue
            end = item.start + item.num_tokens
            upto = end if item.samples else end // self.page * self.page
            upto = min(upto, len(entry.req.origin_input_ids))
            if upto <= entry.sent:
                continue
            positions = np.arange(entry.sent, upto, dtype=np.int64)
            slots = self.req_to_token[entry.req.req_pool_idx, entry.sent : upto].numpy().astype(np.int64)
            # under CP: this cp rank's shard, the positions it stores
            entry.sender.send(*own_shard(self.cp_mapping, self.place.cp_rank, positions, slots))
            entry.sent = upto

    def take_over(self, req: Req, logprob: Optional[float], top: Optional[list]) -> bool:
        """After the first token: report it with the KV; the request leaves `running` (its KV is
        freed once the decode side confirms). False for requests that are not PD requests."""
        entry = self.entries.get(req.rid)
        if entry is None:
            return False
        entry.taken_over = True
        entry.sender.finish(first_token_of(req, logprob, top) if self.place.is_entry else None)
        self.inflight.append(entry)
        return True

    # ------------------------------------------------------------------ early answers
    def set_output_sink(self, sink: OutputSink) -> None:
        """Entry rank: answer a request the moment the decode side confirms its KV, from the
        transfer manager's recv thread through `sink` (that thread's own socket to the
        detokenizer), rather than at the scheduler's next step, which can be a long prefill chunk
        away. sglang-router streams the decode side's tokens only once the prefill side has
        answered, so this is the short requests' time to first token. The scheduler still frees
        the KV at its next step."""
        self.output_sink = sink
        self.manager.set_success_callback(self._on_transfer_success)

    def _on_transfer_success(self, room: int) -> None:
        """(recv thread)"""
        with self.answer_lock:
            entry = self.by_room.get(room)
            if entry is None or not entry.taken_over or entry.answered:
                return
            entry.answered = True
            req = entry.req
            req.finished_reason = {"type": "length", "length": len(req.output_ids)}
            out = build_token_id_out([req])
            self.num_early_answers += 1
        try:
            self.output_sink(out)
        except Exception:  # noqa: BLE001 - the scheduler's own path cannot answer it any more
            logger.exception("PD room %d: the early answer could not be sent", room)

    # ------------------------------------------------------------------ aborts
    def abort_queued(self, rid: str, abort_all: bool, message: str) -> list[Req]:
        """Abort queued requests (bootstrap / inflight); returns them with their KV released."""
        out: list[Req] = []
        for queue_name in ("bootstrap_queue", "inflight"):
            kept = []
            for entry in getattr(self, queue_name):
                if abort_all or entry.req.rid == rid:
                    entry.sender.abort(message)
                    self._forget(entry)
                    if queue_name == "inflight":
                        self.cache.release(entry.req)
                    with self.answer_lock:
                        if entry.answered:
                            continue  # finished and answered already: only its KV was left
                        entry.answered = True
                        entry.req.finished_reason = {"type": "abort", "message": message}
                    out.append(entry.req)
                else:
                    kept.append(entry)
            setattr(self, queue_name, kept)
        return out

    def on_abort(self, req: Req, message: str) -> None:
        """A PD request the scheduler itself aborted (waiting / running): fail its transfer."""
        entry = self.entries.get(req.rid)
        if entry is not None:
            entry.sender.abort(message)
            self._forget(entry)

    def on_requeue(self, req: Req) -> None:
        """The scheduler retracted `req` (KV pressure) and will prefill it again: send its KV again
        from position 0. Writes a transfer thread still makes from the freed slots carry stale
        data, but one thread writes a room's chunks in order, so the re-sent chunks land last."""
        entry = self.entries.get(req.rid)
        if entry is not None:
            entry.sent = 0

    def _fail(self, entry: _Entry, done: list[Req], release: bool) -> None:
        self.num_failed += 1
        reason = entry.sender.failure_exception() or "KV transfer failed"
        self._forget(entry)
        if release:
            self.cache.release(entry.req)
        with self.answer_lock:
            if entry.answered:
                return
            entry.answered = True
            entry.req.finished_reason = {"type": "abort", "message": f"PD transfer failed: {reason}"}
        done.append(entry.req)

    def _forget(self, entry: _Entry) -> None:
        self.entries.pop(entry.req.rid, None)
        if entry.sender.transfers_kv:
            self.by_room.pop(entry.sender.room, None)
        entry.sender.release()

    # ------------------------------------------------------------------ info
    @property
    def busy(self) -> bool:
        return bool(self.bootstrap_queue or self.inflight)

    def internal_state(self) -> dict:
        return {
            "disaggregation_mode": "prefill",
            "pd_bootstrap_queue": len(self.bootstrap_queue),
            "pd_inflight_queue": len(self.inflight),
            "pd_failed_transfers": self.num_failed,
            "pd_early_answers": self.num_early_answers,
            "pd_recent_transfers": list(self.recent),
        }
