"""The decode server's side of PD: a component the scheduler holds.

Queues of a request here: **prealloc** (its receiver looks the prefill ranks up; once they are
known and memory allows, a request row and KV slots for the whole prompt are allocated and their
addresses sent to every prefill rank) -> **transfer** (waiting for every prefill rank's part and
the first token) -> the scheduler's `running` list with `kv_len` = prompt length and the first
token as its first output: it decodes from there. A failed or aborted request leaves through
**draining** when prefill ranks may still write into its slots: the slots are freed only once
every prefill rank acknowledged, or its server is dead, or the waiting timeout passed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np

from sglang.srt.disaggregation.base.conn import BaseDecodeKVManager, BaseKVReceiver
from sglang.srt.disaggregation.base.kv_poll import KVPoll
from sglang.srt.disaggregation.first_token import land_logprobs
from sglang.srt.disaggregation.common import agree
from sglang.srt.disaggregation.component import HELD, NO_MOVES, Admission, Disaggregation, Moves, OutputSink
from sglang.srt.disaggregation.messages import FAKE_BOOTSTRAP_HOST
from sglang.srt.managers.scheduler.schedule_batch import Req, ScheduleBatch

logger = logging.getLogger(__name__)


@dataclass
class _Entry:
    req: Req
    receiver: BaseKVReceiver
    allocated: bool = False


class DecodeDisaggregation(Disaggregation):
    """`manager`: the transfer backend's (factory.py); `local_manager`: the fake backend's, for
    requests served without a peer (bootstrap host FAKE_BOOTSTRAP_HOST)."""

    def __init__(
        self,
        server_args,
        groups,
        runner,
        cache,
        manager: BaseDecodeKVManager,
        local_manager: BaseDecodeKVManager,
    ):
        self.groups = groups
        self.cache = cache
        self.page = runner.kv_page_size
        self.manager = manager
        self.local_manager = local_manager
        self.bootstrap_port = server_args.disaggregation_bootstrap_port
        self.reserved = server_args.num_reserved_decode_tokens
        self.poll_every = server_args.disaggregation_decode_polling_interval
        self.prealloc: list[_Entry] = []
        self.transfer: list[_Entry] = []
        self.draining: list[_Entry] = []
        self.num_failed = 0
        self.num_landed = 0  # requests whose KV and first token arrived (per attention-DP replica)
        self._steps = 0

    # ------------------------------------------------------------------ admission
    def admit(self, req: Req, recv) -> Admission:
        """Take a new request into the prealloc queue, or refuse it."""
        room, host = recv.bootstrap_room, recv.bootstrap_host
        if room is None or host is None:
            return Admission(
                error="this server runs --disaggregation-mode decode: a request needs bootstrap_host, "
                "bootstrap_port and bootstrap_room (send it through sglang-router)"
            )
        manager = self.local_manager if host == FAKE_BOOTSTRAP_HOST else self.manager
        port = recv.bootstrap_port or self.bootstrap_port
        try:
            receiver = manager.create_receiver(room, f"http://{host}:{port}")
        except ValueError as err:
            return Admission(error=str(err))
        receiver.init()
        self.prealloc.append(_Entry(req, receiver))
        return HELD

    # ------------------------------------------------------------------ each scheduler step
    def step(self, running: list[Req]) -> Moves:
        """Requests whose KV arrived (first token appended: to the scheduler's running list);
        requests failed here."""
        ready: list[Req] = []
        done: list[Req] = []
        self._steps += 1
        if self._steps % self.poll_every and not self.draining:
            return NO_MOVES
        if self.prealloc:
            self._step_prealloc(running, done)
        if self.transfer:
            polls = agree(self.groups.replica, [int(e.receiver.poll()) for e in self.transfer])
            keep = []
            for entry, poll in zip(self.transfer, polls):
                if poll == KVPoll.Success:
                    self._land(entry)
                    ready.append(entry.req)
                elif poll == KVPoll.Failed:
                    self._fail(entry, done)
                else:
                    keep.append(entry)
            self.transfer = keep
        if self.draining:
            flags = agree(self.groups.replica, [int(e.receiver.drained) for e in self.draining])
            keep = []
            for entry, drained in zip(self.draining, flags):
                if drained:
                    self._free(entry)
                else:
                    keep.append(entry)
            self.draining = keep
        return Moves(to_running=ready, finished=done)

    def _step_prealloc(self, running: list[Req], done: list[Req]) -> None:
        polls = agree(self.groups.replica, [int(e.receiver.poll()) for e in self.prealloc])
        keep = []
        blocked = False  # first come, first served: a request that does not fit blocks the rest
        for entry, poll in zip(self.prealloc, polls):
            if poll == KVPoll.Failed:
                self._fail(entry, done)
            elif poll >= KVPoll.WaitingForInput and not blocked and self._allocate(entry, running):
                entry.receiver.send_metadata(self._slots(entry.req), row=entry.req.req_pool_idx)
                self.transfer.append(entry)
            else:
                blocked = blocked or poll >= KVPoll.WaitingForInput
                keep.append(entry)
        self.prealloc = keep

    # ------------------------------------------------------------------ memory
    def _reserve(self, req: Req) -> int:
        left = max(0, req.sampling_params.max_new_tokens - len(req.output_ids))
        return min(self.reserved, left)

    def _allocate(self, entry: _Entry, running: list[Req]) -> bool:
        """A request row and KV slots for the prompt, leaving room for the running requests'
        decode growth (--num-reserved-decode-tokens each)."""
        req = entry.req
        n = len(req.origin_input_ids)
        pages = -(-n // self.page) * self.page
        queued = [e.req for e in self.transfer]
        growth = sum(self._reserve(r) for r in running + queued) + self._reserve(req)
        if self.cache.available_tokens() < pages + growth:
            return False
        rows = self.cache.req_to_token_pool.alloc(1)
        if rows is None:
            return False
        allocator = self.cache.allocator
        if allocator.available_size() < pages:
            self.cache.tree.evict(pages - allocator.available_size())
        slots = allocator.alloc_extend([0], [n], [-1])
        if slots is None:
            self.cache.req_to_token_pool.free(rows[0])
            return False
        req.req_pool_idx = rows[0]
        self.cache.req_to_token_pool.req_to_token[req.req_pool_idx, :n] = slots
        req.last_node = self.cache.tree.root_node
        req.cached_prefix_len = 0
        req.kv_len = 0
        entry.allocated = True
        return True

    def _slots(self, req: Req) -> np.ndarray:
        n = len(req.origin_input_ids)
        return self.cache.req_to_token_pool.req_to_token[req.req_pool_idx, :n].numpy().astype(np.int64)

    def _land(self, entry: _Entry) -> None:
        """The KV is here: the request continues as a decode with the prefill's first token."""
        req = entry.req
        first = entry.receiver.first_token
        req.kv_len = len(req.origin_input_ids)
        req.output_ids.append(int(first.token_id))
        land_logprobs(req, first)
        self.num_landed += 1
        self._release_receiver(entry)

    def _fail(self, entry: _Entry, done: list[Req]) -> None:
        self.num_failed += 1
        req = entry.req
        reason = entry.receiver.failure_exception() or "KV transfer failed"
        req.finished_reason = {"type": "abort", "message": f"PD transfer failed: {reason}"}
        done.append(req)
        if entry.allocated:
            self.draining.append(entry)  # slots freed once no prefill rank can write into them
        else:
            self._release_receiver(entry)

    def _free(self, entry: _Entry) -> None:
        req = entry.req
        if entry.allocated and req.req_pool_idx is not None:
            n = len(req.origin_input_ids)
            self.cache.allocator.free(self.cache.req_to_token_pool.req_to_token[req.req_pool_idx, :n].clone())
            self.cache.req_to_token_pool.free(req.req_pool_idx)
            req.reset_memory_state()
        entry.allocated = False
        self._release_receiver(entry)

    def _release_receiver(self, entry: _Entry) -> None:
        entry.receiver.release()

    # ------------------------------------------------------------------ aborts
    def abort_queued(self, rid: str, abort_all: bool, message: str) -> list[Req]:
        """Abort queued requests (prealloc / transfer); slots a prefill rank may still write into
        are freed through the draining queue."""
        out: list[Req] = []
        for queue_name in ("prealloc", "transfer"):
            kept = []
            for entry in getattr(self, queue_name):
                if abort_all or entry.req.rid == rid:
                    entry.receiver.abort(message)
                    entry.req.finished_reason = {"type": "abort", "message": message}
                    out.append(entry.req)
                    if entry.allocated:
                        self.draining.append(entry)
                    else:
                        self._release_receiver(entry)
                else:
                    kept.append(entry)
            setattr(self, queue_name, kept)
        return out

    def on_abort(self, req: Req, message: str) -> None:
        """Requests in `running` hold no receiver any more: nothing to do."""

    def on_requeue(self, req: Req) -> None:
        """A retracted decode request is prefilled again locally (prompt + output): nothing to do."""

    # ------------------------------------------------------------------ prefill-side hooks
    def after_forward(self, batch: ScheduleBatch) -> None:
        """KV moves towards this server, never from it."""

    def take_over(self, req: Req, logprob: Optional[float], top: Optional[list]) -> bool:
        return False  # requests finish here

    def rooms_of(self, batch: ScheduleBatch) -> list:
        return []  # a decode server runs no pipeline stages

    def set_output_sink(self, sink: OutputSink) -> None:
        """Requests are answered by the scheduler's steps."""

    # ------------------------------------------------------------------ info
    @property
    def busy(self) -> bool:
        return bool(self.prealloc or self.transfer or self.draining)

    def internal_state(self) -> dict:
        return {
            "disaggregation_mode": "decode",
            "pd_prealloc_queue": len(self.prealloc),
            "pd_transfer_queue": len(self.transfer),
            "pd_draining": len(self.draining),
            "pd_failed_transfers": self.num_failed,
            "pd_landed": self.num_landed,
        }
