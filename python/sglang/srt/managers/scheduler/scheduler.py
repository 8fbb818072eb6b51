"""Scheduler: the loop orchestrator of one rank. It holds components and inherits nothing.

- `RequestAdmission` turns a tokenized request into a `Req` or refuses it (400 / 503);
- `KVCacheManager` gives requests KV rows/slots and returns them to the radix cache;
- `SchedulePolicy` picks each step's work (decodes + prefill chunks, continuous batching);
- `ModelRunner` runs the forward and samples (the scheduler never touches tensors);
- `SchedulerIO` (ZMQ) carries messages in and out when running as a process;
- `DPLockstep` (attention DP only) agrees every step's token counts with the other replicas of the
  stage and makes this replica run an IDLE forward when it has no tokens but another has.
- `SchedulerWatchdog` sees forward progress (`--watchdog-timeout`); its thread sends heartbeats
  with the latest state snapshot; `SchedulerProfiler` runs torch.profiler (/start_profile).
- `Disaggregation` (PD; disaggregation/component.py) holds a prefill or decode server's transfer
  queues; a normal server's does nothing. The scheduler calls it at fixed points: `admit`,
  `step` (`disagg_step`), `after_forward`, `take_over`, `abort_queued` / `on_abort`, `on_requeue`.

The same object runs in-process (tests, benchmarks) through `add_request` / `step`. Its loop is
`event_loop`; with pipeline parallelism stage 0's `managers/pp/driver.py` drives it instead (the
process entry is `scheduler_process.py`). Whatever the loop, everything the scheduler takes from
outside comes through its constructor: an existing `ModelRunner`, a dynamic-chunking budget,
extra `internal_state()` entries, an observer of every step's result.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Optional

from sglang.srt.constrained.factory import create_grammar_manager
from sglang.srt.disaggregation.component import Disaggregation
from sglang.srt.disaggregation.factory import create_disaggregation
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchTokenIDOut,
    ClearHiCacheReqInput,
    DPLoadReport,
    DPWakeUp,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GetInternalStateReqInput,
    GetInternalStateReqOutput,
    ProfileReqInput,
    SchedulerReadyInfo,
    TokenizedGenerateReqInput,
)
from sglang.srt.managers.scheduler.admission import RequestAdmission, refuse
from sglang.srt.managers.scheduler.cache_manager import KVCacheManager, build_prefix_cache
from sglang.srt.managers.scheduler.dp_lockstep import DPLockstep
from sglang.srt.managers.scheduler.jump_forward import jump_forward
from sglang.srt.managers.scheduler.logprob_step import apply_step, sampled_logprobs
from sglang.srt.managers.scheduler.profiler import SchedulerProfiler
from sglang.srt.managers.scheduler.retraction import shrink_for_memory
from sglang.srt.managers.scheduler.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.scheduler.schedule_policy import ChunkBudgetFn, SchedulePolicy, StepBudget
from sglang.srt.managers.scheduler.scheduler_output import StepStats, build_token_id_out, due_for_output
from sglang.srt.managers.scheduler.scheduler_watchdog import SchedulerWatchdog
from sglang.srt.model_executor.model_runner import ForwardResult, ModelRunner
from sglang.srt.model_executor.step_label import step_label
from sglang.srt.model_executor.worker_batch import ModelWorkerBatch
from sglang.srt.server_args import ServerArgs

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler.scheduler_io import SchedulerPort

logger = logging.getLogger(__name__)

# Called with every applied step: the scheduled batch and its result (tests read the logits).
StepObserver = Callable[[ScheduleBatch, ForwardResult], None]


class Scheduler:
    def __init__(
        self,
        server_args: ServerArgs,
        groups: Optional[ParallelGroups] = None,
        tokenizer=None,
        runner: Optional[ModelRunner] = None,
        chunk_budget: Optional[ChunkBudgetFn] = None,
        extra_state: Optional[Callable[[], dict]] = None,
        on_step_result: Optional[StepObserver] = None,
        dp_lockstep: Optional[DPLockstep] = None,
    ):
        """`runner`: an already built runner of this rank (default: build one). `chunk_budget`:
        dynamic chunking's per-step prefill budget (None: fixed chunks). `extra_state`: more
        `internal_state()` entries (the PP driver's bubble ratios). `on_step_result`: observer of
        each applied step (tests). `dp_lockstep`: with attention DP, the agreement `step()` makes
        with the other replicas (the PP driver does its own and passes none)."""
        self.server_args = server_args
        self.groups = groups or ParallelGroups.single()
        self.runner = runner if runner is not None else ModelRunner(server_args, self.groups)
        self.model_config = self.runner.model_config
        self.tokenizer = tokenizer  # stop strings (None with --skip-tokenizer-init)
        self.eos_token_ids = set(self.model_config.eos_token_ids)
        self.context_len = self.model_config.context_len

        # kv_page_size: the allocator's page (page_size · cp under context parallelism: virtual slots)
        kv_page = self.runner.kv_page_size
        tree = build_prefix_cache(server_args, self.runner, self.groups)  # radix, or HiCache's tiers
        self.cache = KVCacheManager(self.runner.req_to_token_pool, self.runner.allocator, tree)
        self.policy = SchedulePolicy(
            server_args.schedule_policy,
            StepBudget(
                prefill_tokens=server_args.prefill_step_tokens,
                chunked=server_args.chunked_prefill_enabled,
                max_running_requests=self.runner.max_running_requests,
                page_size=kv_page,
                short_first_tokens=server_args.resolved_short_prompt_first_tokens,
                pack_tokens=server_args.resolved_prefill_pack_tokens,
            ),
            self.cache,
            chunk_budget=chunk_budget,
        )
        self.max_req_input_len = min(self.context_len - 1, self.runner.max_total_num_tokens - 1)
        self.admission = RequestAdmission(
            tokenizer, self.max_req_input_len, self.model_config.vocab_size, server_args.max_queued_requests
        )

        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self._pending_outputs: list[Req] = []  # finished/aborted outside a step, to report
        self.forward_ct = 0
        self.num_retractions = 0
        self.on_step_result = on_step_result
        self.extra_state = extra_state
        self.dp = dp_lockstep
        self.num_received = 0  # generate requests taken (the DP controller's load accounting)
        self._last_load: Optional[tuple[int, int]] = None
        self.stats = StepStats(time.monotonic(), decode_log_interval=server_args.decode_log_interval)
        self.profiler = SchedulerProfiler(self.groups.world_rank)  # /start_profile, /stop_profile
        # Reliability (issue 19): progress watchdog + state snapshots; the process entry starts its thread.
        self.watchdog = SchedulerWatchdog(
            server_args.watchdog_timeout, rank=self.groups.world_rank, dp_rank=self.groups.dp_rank
        )
        # PD disaggregation: a prefill / decode server's transfer queues (disaggregation/README.md)
        self.disagg: Disaggregation = create_disaggregation(server_args, self.groups, self.runner, self.cache)
        # Constrained decoding (constrained/README.md): grammar queue, matchers, each step's token bitmask
        self.grammar = create_grammar_manager(
            server_args.grammar_backend,
            tokenizer,
            self.model_config.vocab_size,
            self.eos_token_ids,
            self.groups.replica,
            jump_forward=server_args.enable_jump_forward,
            any_whitespace=not server_args.constrained_json_disable_any_whitespace,
        )

    # ------------------------------------------------------------------ info
    def ready_info(self) -> SchedulerReadyInfo:
        return SchedulerReadyInfo(
            max_total_num_tokens=self.runner.max_total_num_tokens,
            max_req_input_len=self.max_req_input_len,
            context_len=self.context_len,
            vocab_size=self.model_config.vocab_size,
            max_running_requests=self.runner.max_running_requests,
        )

    def internal_state(self) -> dict:
        return {
            "dp_rank": self.groups.dp_rank,
            "max_total_num_tokens": self.runner.max_total_num_tokens,
            "available_kv_tokens": self.cache.available_tokens(),
            "free_kv_tokens": self.cache.free_slots(),
            "evictable_kv_tokens": self.cache.tree.evictable_size(),
            "free_req_slots": self.runner.req_to_token_pool.available_size(),  # request table rows
            "max_req_slots": self.runner.req_to_token_pool.size,
            "num_running_reqs": len(self.running),
            "num_waiting_reqs": len(self.waiting),
            "max_running_requests": self.runner.max_running_requests,
            "forward_ct": self.forward_ct,
            "num_retractions": self.num_retractions,
            "pp_bubble_ratio": [],  # each pipeline stage's bubble ratio: the PP driver's `extra_state`
            **self.runner.kv_state(self.cache.free_slots()),  # cp size, physical KV pool / usage per rank
            **(self.dp.state() if self.dp is not None else {}),
            **(self.extra_state() if self.extra_state is not None else {}),
            **self.disagg.internal_state(),
            **self.grammar.internal_state(),
            **self.cache.internal_state(),  # prefill tokens computed, HiCache hits per tier
            **self.stats.state(),  # gen_throughput, queue_time (/metrics)
        }

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting) or self.disagg.busy or self.grammar.busy

    def load_report(self) -> Optional[DPLoadReport]:
        """This replica's load for the DP controller, when it changed since the last report."""
        used = self.runner.max_total_num_tokens - self.cache.available_tokens()
        tokens = used + sum(len(r.origin_input_ids) for r in self.waiting)
        load = (len(self.running) + len(self.waiting), tokens, self.num_received)
        if load == self._last_load:
            return None
        self._last_load = load
        return DPLoadReport(self.groups.dp_rank, load[0], load[1], load[2])

    # ------------------------------------------------------------------ inputs
    def apply_messages(self, msgs: list, io: Optional["SchedulerPort"]) -> None:
        """The message step of every loop: apply the incoming messages in order and send each
        control reply to the tokenizer (through `io`: the entry rank's; None on mirror ranks)."""
        for msg in msgs:
            reply = self.handle_message(msg)
            if reply is not None and io is not None:
                io.reply(reply)

    def handle_message(self, msg):
        """Apply one incoming message; returns a control reply for the tokenizer, if any."""
        if isinstance(msg, TokenizedGenerateReqInput):
            self.num_received += 1
            self.add_request(msg)
        elif isinstance(msg, DPWakeUp):
            pass  # its only job was to end the idle receive
        elif isinstance(msg, AbortReq):
            return self.abort(msg)
        elif isinstance(msg, FlushCacheReqInput):
            return self.flush_cache()
        elif isinstance(msg, ClearHiCacheReqInput):
            return self.cache.clear_storage()
        elif isinstance(msg, GetInternalStateReqInput):
            return GetInternalStateReqOutput(state=self.internal_state())
        elif isinstance(msg, ProfileReqInput):
            return self.profiler.handle(msg)
        else:
            logger.error("unknown message type %s ignored", type(msg).__name__)
        return None

    def add_request(self, recv: TokenizedGenerateReqInput) -> Req:
        req = self.admission.new_req(recv)
        refusal = self.admission.refusal(req, len(self.waiting))
        no_grammar = self.grammar.refusal(req)
        if refusal is None and no_grammar is not None:
            refusal = (no_grammar, 400)
        if refusal is None:
            admission = self.disagg.admit(req, recv)  # PD: the request waits in the transfer queues first
            if admission.held:
                self.grammar.prepare(req)  # its grammar compiles meanwhile
                return req
            refusal = (admission.error, 400) if admission.error else None
        if refusal is not None:
            refuse(req, refusal)
            self._pending_outputs.append(req)
        else:
            self.waiting.extend(self.grammar.route([req]))  # a grammar still compiling: the grammar queue
        return req

    def abort(self, msg: AbortReq):
        self._pending_outputs += self.disagg.abort_queued(msg.rid, msg.abort_all, msg.message)  # PD queues
        targets = [r for r in self.waiting + self.running if msg.abort_all or r.rid == msg.rid]
        for req in targets + self.grammar.abort(msg.rid, msg.abort_all):
            self.disagg.on_abort(req, msg.message)
            req.finished_reason = {"type": "abort", "message": msg.message}
            if req in self.waiting:
                self.waiting.remove(req)
                self.cache.end_prefetch(req)
            elif req in self.running:
                self.running.remove(req)
                self.cache.release(req)
            self._pending_outputs.append(req)
        return None

    def flush_cache(self) -> FlushCacheReqOutput:
        if self.has_work:
            return FlushCacheReqOutput(False, "cannot flush the cache while requests are running")
        self.cache.flush()
        return FlushCacheReqOutput(True)

    # ------------------------------------------------------------------ one step
    def step(self) -> Optional[BatchTokenIDOut]:
        """Run one forward step (if there is work) and return the outputs due. With attention DP
        every replica of the stage calls it each iteration (it joins the lockstep agreement)."""
        self.disagg_step()
        if self.dp is not None:
            self._dp_step()
        elif self.has_work:
            with step_label("sched.schedule"):
                batch, worker_batch = self.schedule()
            if worker_batch is not None:
                result = self.runner.forward(worker_batch)
                with step_label("sched.process_result"):
                    self.process_result(batch, result)
        with step_label("sched.collect_outputs"):
            return self.collect_outputs()

    def _dp_step(self) -> None:
        """Schedule this replica's step, agree the counts with the other replicas, and run the
        forward when any replica has tokens (IDLE when this one has none)."""
        batch, worker_batch = self.schedule() if self.has_work else (None, None)
        tokens = len(worker_batch.input_ids) if worker_batch is not None else 0
        rows = worker_batch.num_logit_rows if worker_batch is not None else 0
        info = self.dp.agree(tokens, rows, self.has_work)
        if info is None:
            return
        if worker_batch is None:
            self.runner.forward_idle(info)
        else:
            self.process_result(batch, self.runner.forward(worker_batch, info))

    def disagg_step(self) -> None:
        """PD: move requests between the transfer queues and the scheduler's lists (every loop
        calls it once per iteration on every rank of the stage: it agrees on poll results)."""
        moves = self.disagg.step(self.running)
        self.waiting.extend(self.grammar.route(moves.to_waiting))
        done = list(moves.finished)
        for req in moves.to_running:  # the KV and the first token arrived: decode from here
            self.grammar.catch_up(req)  # its matcher, advanced over the first token
            req.check_finished(self.eos_token_ids, self.tokenizer, self.context_len)
            if req.finished:
                self.cache.release(req)
                done.append(req)
            else:
                self.running.append(req)
        self._pending_outputs += done
        if self.disagg.busy and not (self.running or self.waiting or done):
            time.sleep(0.002)  # only transfers pending: poll them without spinning a core

    def collect_outputs(self) -> Optional[BatchTokenIDOut]:
        due, self._pending_outputs = self._pending_outputs, []
        due += [r for r in self.running if due_for_output(r, self.server_args.stream_interval)]
        for req in due:
            if req.finished:
                self.grammar.release(req)
        self._maybe_log_stats()
        self.watchdog.publish(self.internal_state, busy=self.has_work)
        return build_token_id_out(due)

    def schedule(
        self, max_reqs: Optional[int] = None, max_decodes: Optional[int] = None
    ) -> tuple[ScheduleBatch, Optional[ModelWorkerBatch]]:
        """Pick the next step's work and allocate its KV slots. Each request's `kv_len` advances
        now (its KV is written by the step; later steps reach each layer after it), and a request
        due a token is `in_flight` until `process_result`: a pipelined caller may schedule further
        steps before this one's result is back.
        `max_reqs` / `max_decodes` cap the requests / decodes of the step (pipeline micro-batches)."""
        ready, failed = self.grammar.poll(block=not (self.running or self.waiting))  # compiled grammars
        self.waiting += ready
        self._pending_outputs += failed
        self.cache.prefetch_waiting(self.waiting, idle=not self.running)  # HiCache: storage reads start
        batch, admitted = self.policy.build_step(
            self.running, self.waiting, max_items=max_reqs, max_decodes=max_decodes
        )
        for req in admitted:
            self.waiting.remove(req)
            self.running.append(req)
        if batch.is_empty:
            return batch, None
        out_cache_loc = self.cache.alloc_for_step(batch.items)
        while out_cache_loc is None:
            batch = shrink_for_memory(self, batch)
            if batch.is_empty:
                return batch, None
            out_cache_loc = self.cache.alloc_for_step(batch.items)
        worker_batch = batch.to_worker_batch(out_cache_loc)
        worker_batch.vocab_mask = self.grammar.fill_mask([it.req for it in batch.items if it.samples])
        for item in batch.items:
            item.req.kv_len = item.start + item.num_tokens
            item.req.in_flight = item.samples
        self.forward_ct += 1
        self.stats.on_launch(batch, time.monotonic())
        self.watchdog.step_started()
        self.watchdog.publish(self.internal_state, busy=True)  # what the step holds, before it runs
        return batch, worker_batch

    def _requeue(self, req: Req) -> None:
        self.running.remove(req)
        self.cache.release(req)
        self.disagg.on_requeue(req)  # PD prefill: its KV is sent again after re-admission
        self.waiting.insert(0, req)

    def process_result(self, batch: ScheduleBatch, result: ForwardResult) -> None:
        """Apply a finished step: append sampled tokens, finish requests, release their KV."""
        self.watchdog.step_finished()
        if self.on_step_result is not None:
            self.on_step_result(batch, result)
        self.disagg.after_forward(batch)  # PD prefill: this chunk's KV starts moving now
        self.stats.add_step(batch)
        apply_step(batch, result)  # prompt logprobs of this step's rows
        self.profiler.on_step()
        sampled = 0
        for item in batch.items:
            req = item.req
            if not item.samples:
                continue
            row = sampled
            sampled += 1
            if req.finished:  # aborted while in flight; its KV is already released
                continue
            req.in_flight = False
            if req.sampling_params.max_new_tokens == 0:  # prefill only (e.g. prompt scoring)
                req.finished_reason = {"type": "length", "length": 0}
                self.running.remove(req)
                self.cache.release(req)
                self._pending_outputs.append(req)
                continue
            lp, top, ids = sampled_logprobs(req, result, row)
            req.append_token(result.next_token_ids[row], lp, top, ids)
            self.grammar.on_token(req, result.next_token_ids[row])  # finishes it when the grammar ends
            if self.disagg.take_over(req, lp, top):  # PD prefill: the decode server continues it
                self.running.remove(req)
                self.grammar.release(req)
                continue
            req.check_finished(self.eos_token_ids, self.tokenizer, self.context_len)
            jump_forward(self, req)  # the text its grammar forces, appended (--enable-jump-forward)
            if req.finished:
                self.running.remove(req)
                self.cache.release(req)
                self._pending_outputs.append(req)

    # ------------------------------------------------------------------ logging
    def _maybe_log_stats(self) -> None:
        now = time.monotonic()
        if self.groups.replica.is_first and self.stats.due(now):
            used = self.runner.max_total_num_tokens - self.cache.available_tokens()
            self.stats.log(now, len(self.running), len(self.waiting), used / self.runner.max_total_num_tokens)

    # ------------------------------------------------------------------ process loop
    def event_loop(self, io: Optional["SchedulerPort"]) -> None:
        """Serve forever. `io` is the entry rank's SchedulerIO (its replica's, with attention DP),
        None on the other ranks, which mirror it: every message is broadcast inside the replica."""
        mirrors = self.groups.replica  # the stage's tp group when dp = 1
        while True:
            msgs = io.recv_all(block=self.may_block()) if io is not None else None
            if mirrors.size > 1:
                msgs = mirrors.broadcast_object(msgs, src=0)
            with step_label("sched.apply_messages"):
                self.apply_messages(msgs, io)
            out = self.step()
            if io is not None:
                if out is not None:
                    io.emit(out)
                if self.dp is not None:
                    report = self.load_report()
                    if report is not None:
                        io.report(report)

    def may_block(self) -> bool:
        """Whether the next receive may wait for messages: nothing to do here, and (attention DP)
        no replica had work at the last agreement, so nobody waits for this one."""
        return not self.has_work and (self.dp is None or not self.dp.any_work)

    # ------------------------------------------------------------------ in-process driver
    def run_until_idle(self, max_steps: int = 1_000_000) -> list[BatchTokenIDOut]:
        outputs = []
        for _ in range(max_steps):
            out = self.step()
            if out is not None:
                outputs.append(out)
            if not self.has_work and not self._pending_outputs:
                break
        return outputs
