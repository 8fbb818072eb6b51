"""The data-parallel controller (attention DP, `--dp-size D --enable-dp-attention`): one process
between the tokenizer manager and the D attention-DP replicas (docs/dp_attention.md, "Controller").

It binds the address the tokenizer sends to and forwards:
- a generate request to ONE replica, chosen by `--load-balance-method` (`DPBalancer`; on a PD
  server by its bootstrap room, `room % dp_size`), and a
  `DPWakeUp` to every other replica (so that one blocked in its idle receive joins the next lockstep
  exchange at once instead of after its poll timeout);
- an abort to every replica (a replica without the rid ignores it);
- a flush / internal-state request to every replica; it answers the tokenizer once all replicas
  have replied (flush: success only if every replica succeeded; state: the merged figures plus each
  replica's own, `GetInternalStateReqOutput.replica_states`).
Replicas send their control replies wrapped in `DPReply` (so the controller knows whose it is),
`DPLoadReport`s when their load changes, and heartbeats (`SchedulerHeartbeat`, from each entry
rank's watchdog thread): once every replica has sent one, each new beat goes on to the tokenizer
merged with the others' latest (`merge_heartbeats`), so the info endpoints and /health_generate
see the whole server. Token ids go from the replicas straight to the
detokenizer, as with one replica.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

import zmq

from sglang.srt.disaggregation.role import DisaggregationRole
from sglang.srt.managers.io_struct import (
    AbortReq,
    DPLoadReport,
    DPReply,
    DPWakeUp,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GetInternalStateReqInput,
    GetInternalStateReqOutput,
    ProfileReqInput,
    SchedulerHeartbeat,
    TokenizedGenerateReqInput,
)
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.utils.process import configure_logger, watch_parent

logger = logging.getLogger(__name__)

LOAD_BALANCE_METHODS = ("auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens")

# internal-state figures that add up over the replicas (the others are replica 0's)
SUMMED_STATE_KEYS = (
    "max_total_num_tokens",
    "available_kv_tokens",
    "free_kv_tokens",
    "evictable_kv_tokens",
    "num_running_reqs",
    "num_waiting_reqs",
    "max_running_requests",
    "num_retractions",
    "free_req_slots",
    "max_req_slots",
)


@dataclass
class _ReplicaLoad:
    reported_reqs: int = 0
    reported_tokens: int = 0
    received: int = 0  # generate requests the replica had taken at its last report
    in_transit: deque = field(default_factory=deque)  # token counts of requests sent since then


class DPBalancer:
    """Which replica takes the next request.

    - `round_robin` (and `auto` on a normal server): in turn;
    - `follow_bootstrap_room` (and `auto` on a PD server, `pd=True`): replica `bootstrap_room %
      dp_size`, upstream's rule, so the other side of the transfer can tell which replica holds a
      room from the room alone; a request without a room goes round robin;
    - `total_requests`: the fewest running + waiting requests;
    - `total_tokens`: the fewest tokens held (KV in use + waiting prompts).
    Loads are the replicas' last reports plus the requests sent to them that their report did not
    count yet (`DPLoadReport.received`); ties go to the lowest dp rank."""

    def __init__(self, dp_size: int, method: str = "round_robin", pd: bool = False):
        if method not in LOAD_BALANCE_METHODS:
            raise ValueError(
                f"--load-balance-method must be one of {list(LOAD_BALANCE_METHODS)}, got {method!r}"
            )
        self.dp_size = dp_size
        if method == "auto":
            method = "follow_bootstrap_room" if pd else "round_robin"
        self.method = method
        self.loads = [_ReplicaLoad() for _ in range(dp_size)]
        self.sent = [0] * dp_size
        self._next = 0

    def pick(self, num_tokens: int, room: Optional[int] = None) -> int:
        if self.method == "follow_bootstrap_room" and room is not None:
            d = room % self.dp_size
        elif self.method in ("round_robin", "follow_bootstrap_room"):
            d = self._next
            self._next = (self._next + 1) % self.dp_size
        elif self.method == "total_requests":
            d = min(range(self.dp_size), key=lambda i: (self.num_reqs(i), i))
        else:
            d = min(range(self.dp_size), key=lambda i: (self.num_tokens(i), i))
        self.sent[d] += 1
        self.loads[d].in_transit.append(num_tokens)
        return d

    def on_report(self, report: DPLoadReport) -> None:
        load = self.loads[report.dp_rank]
        load.reported_reqs, load.reported_tokens = report.num_reqs, report.num_tokens
        for _ in range(max(0, report.received - load.received)):
            if load.in_transit:
                load.in_transit.popleft()
        load.received = max(load.received, report.received)

    def num_reqs(self, d: int) -> int:
        load = self.loads[d]
        return load.reported_reqs + len(load.in_transit)

    def num_tokens(self, d: int) -> int:
        load = self.loads[d]
        return load.reported_tokens + sum(load.in_transit)


def merge_states(states: list[dict]) -> dict:
    """One internal-state dict for the whole server: summed counts, the rest from replica 0."""
    merged = dict(states[0])
    for key in SUMMED_STATE_KEYS:
        values = [s.get(key) for s in states]
        if all(isinstance(v, (int, float)) for v in values):
            merged[key] = sum(values)
    merged["dp_size"] = len(states)
    merged.pop("dp_rank", None)
    return merged


class ReplyCollector:
    """Matches the replicas' control replies to the requests the controller fanned out: the k-th
    reply of a kind from each replica belongs to the k-th request of that kind."""

    def __init__(self, dp_size: int):
        self.dp_size = dp_size
        self.queues: dict[type, list[deque]] = {}

    def add(self, dp_rank: int, reply: Any) -> list[Any]:
        """Store one replica's reply; returns the complete sets (one reply per replica, in dp order)."""
        queues = self.queues.setdefault(type(reply), [deque() for _ in range(self.dp_size)])
        queues[dp_rank].append(reply)
        done = []
        while all(queues):
            done.append([q.popleft() for q in queues])
        return done


def merge_heartbeats(beats: list[SchedulerHeartbeat]) -> SchedulerHeartbeat:
    """One heartbeat for the server: the longest-running step's start (a stuck replica shows), the
    steps finished summed, the oldest snapshot time, merged state plus each replica's."""
    busy = [b.busy_since for b in beats if b.busy_since is not None]
    states = [b.state for b in beats]
    return SchedulerHeartbeat(
        rank=beats[0].rank,
        sent_time=max(b.sent_time for b in beats),
        steps_finished=sum(b.steps_finished for b in beats),
        steps_in_flight=sum(b.steps_in_flight for b in beats),
        busy_since=min(busy) if busy else None,
        state=merge_states(states) if all(states) else {},
        state_time=min(b.state_time for b in beats),
        watchdog_timeout=beats[0].watchdog_timeout,
        replica_states=states,
    )


def merge_replies(replies: list[Any]) -> Any:
    first = replies[0]
    if isinstance(first, FlushCacheReqOutput):
        failed = [f"replica {d}: {r.message}" for d, r in enumerate(replies) if not r.success]
        return FlushCacheReqOutput(not failed, "; ".join(failed))
    if isinstance(first, GetInternalStateReqOutput):
        states = [r.state for r in replies]
        return GetInternalStateReqOutput(state=merge_states(states), replica_states=states)
    return first


class DataParallelController:
    def __init__(self, server_args: ServerArgs, port_args: PortArgs):
        self.dp_size = server_args.dp_size
        pd = DisaggregationRole.of(server_args).enabled  # PD: rooms pick the replica
        self.balancer = DPBalancer(self.dp_size, server_args.load_balance_method, pd=pd)
        self.replies = ReplyCollector(self.dp_size)
        self.beats: list[Optional[SchedulerHeartbeat]] = [None] * self.dp_size
        self.context = zmq.Context(2)
        self.recv_from_tokenizer = self.context.socket(zmq.PULL)
        self.recv_from_tokenizer.bind(port_args.scheduler_input_ipc_name)
        self.recv_from_replicas = self.context.socket(zmq.PULL)
        self.recv_from_replicas.bind(port_args.dp_controller_ipc_name)
        self.send_to_tokenizer = self.context.socket(zmq.PUSH)
        self.send_to_tokenizer.connect(port_args.tokenizer_ipc_name)
        self.to_replicas = []
        for d in range(self.dp_size):
            sock = self.context.socket(zmq.PUSH)
            sock.connect(port_args.replica_input_ipc_name(d, self.dp_size))
            self.to_replicas.append(sock)
        self.poller = zmq.Poller()
        self.poller.register(self.recv_from_tokenizer, zmq.POLLIN)
        self.poller.register(self.recv_from_replicas, zmq.POLLIN)

    def handle_request(self, msg: Any) -> None:
        if isinstance(msg, TokenizedGenerateReqInput):
            d = self.balancer.pick(len(msg.input_ids), msg.bootstrap_room)
            self.to_replicas[d].send_pyobj(msg)
            for other, sock in enumerate(self.to_replicas):
                if other != d:
                    sock.send_pyobj(DPWakeUp())
        elif isinstance(msg, (AbortReq, FlushCacheReqInput, GetInternalStateReqInput, ProfileReqInput)):
            for sock in self.to_replicas:
                sock.send_pyobj(msg)
        else:
            logger.error("unknown message type %s ignored", type(msg).__name__)

    def handle_replica(self, msg: Any) -> None:
        if isinstance(msg, DPLoadReport):
            self.balancer.on_report(msg)
        elif isinstance(msg, SchedulerHeartbeat):
            self.beats[msg.dp_rank] = msg
            if all(b is not None for b in self.beats):
                try:
                    self.send_to_tokenizer.send_pyobj(merge_heartbeats(self.beats), zmq.NOBLOCK)
                except zmq.Again:
                    pass  # the tokenizer is not reading: drop this beat
        elif isinstance(msg, DPReply):
            for replies in self.replies.add(msg.dp_rank, msg.reply):
                self.send_to_tokenizer.send_pyobj(merge_replies(replies))
        else:
            logger.error("unknown replica message %s ignored", type(msg).__name__)

    def event_loop(self) -> None:
        while True:
            for sock, _ in self.poller.poll():
                while True:
                    try:
                        msg = sock.recv_pyobj(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if sock is self.recv_from_tokenizer:
                        self.handle_request(msg)
                    else:
                        self.handle_replica(msg)


def run_data_parallel_controller_process(server_args: ServerArgs, port_args: PortArgs) -> None:
    """Process entry: serve forever; exit non-zero on failure."""
    configure_logger(server_args.log_level, "DP controller")
    watch_parent()
    try:
        controller = DataParallelController(server_args, port_args)
        logger.info("data-parallel controller ready (pid %d, %d replicas)", os.getpid(), server_args.dp_size)
        controller.event_loop()
    except KeyboardInterrupt:
        sys.exit(0)
    except Exception:  # noqa: BLE001
        logger.error("data-parallel controller failed:\n%s", traceback.format_exc())
        sys.exit(1)
