"""Scheduler: the loop orchestrator of one rank. It holds components and inherits nothing.

- `KVCacheManager` gives requests KV rows/slots and returns them to the radix cache;
- `SchedulePolicy` picks each step's work (decodes + prefill chunks, continuous batching);
- `ModelRunner` runs the forward and samples (the scheduler never touches tensors);
- `SchedulerIO` (ZMQ) carries messages in and out when running as a process.

The same object runs in-process (tests, benchmarks) through `add_request` / `step`.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.managers.cache_manager import KVCacheManager
from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchTokenIDOut,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GetInternalStateReqInput,
    GetInternalStateReqOutput,
    SchedulerReadyInfo,
    TokenizedGenerateReqInput,
)
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import SchedulePolicy, StepBudget, pick_retract_victim
from sglang.srt.managers.scheduler_output import build_token_id_out, due_for_output
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.model_runner import ForwardResult, ModelRunner
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

STATS_LOG_INTERVAL_S = 10.0


class Scheduler:
    def __init__(
        self,
        server_args: ServerArgs,
        groups: Optional[ParallelGroups] = None,
        tokenizer=None,
        keep_logits: bool = False,
    ):
        self.server_args = server_args
        self.groups = groups or ParallelGroups.single()
        self.runner = ModelRunner(server_args, self.groups, keep_logits=keep_logits)
        self.model_config = self.runner.model_config
        self.tokenizer = tokenizer
        self.eos_token_ids = set(self.model_config.eos_token_ids)
        self.context_len = self.model_config.context_len

        tree = RadixCache(self.runner.allocator, server_args.page_size, disable=server_args.disable_radix_cache)
        self.cache = KVCacheManager(self.runner.req_to_token_pool, self.runner.allocator, tree)
        prefill_budget = server_args.max_prefill_tokens
        if server_args.chunked_prefill_enabled:
            prefill_budget = min(prefill_budget, server_args.chunked_prefill_size)
        self.policy = SchedulePolicy(
            server_args.schedule_policy,
            StepBudget(
                prefill_tokens=prefill_budget,
                chunked=server_args.chunked_prefill_enabled,
                max_running_requests=self.runner.max_running_requests,
                page_size=server_args.page_size,
            ),
            self.cache,
        )
        self.max_req_input_len = min(self.context_len - 1, self.runner.max_total_num_tokens - 1)

        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self._pending_outputs: list[Req] = []  # finished/aborted outside a step, to report
        self.forward_ct = 0
        self.num_retractions = 0
        self.last_logits = None  # float32 logits of the sampled rows of the last step (tests)
        self.on_step_result: Optional[Callable[[ScheduleBatch, ForwardResult], None]] = None
        self._last_stats = time.monotonic()
        self._stats = {"prefill_tokens": 0, "decode_tokens": 0, "steps": 0}

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
            "max_total_num_tokens": self.runner.max_total_num_tokens,
            "available_kv_tokens": self.cache.available_tokens(),
            "free_kv_tokens": self.cache.free_slots(),
            "evictable_kv_tokens": self.cache.tree.evictable_size(),
            "num_running_reqs": len(self.running),
            "num_waiting_reqs": len(self.waiting),
            "max_running_requests": self.runner.max_running_requests,
            "forward_ct": self.forward_ct,
        }

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------ inputs
    def handle_message(self, msg):
        """Apply one incoming message; returns a control reply for the tokenizer, if any."""
        if isinstance(msg, TokenizedGenerateReqInput):
            self.add_request(msg)
        elif isinstance(msg, AbortReq):
            return self.abort(msg)
        elif isinstance(msg, FlushCacheReqInput):
            return self.flush_cache()
        elif isinstance(msg, GetInternalStateReqInput):
            return GetInternalStateReqOutput(state=self.internal_state())
        else:
            logger.error("unknown message type %s ignored", type(msg).__name__)
        return None

    def add_request(self, recv: TokenizedGenerateReqInput) -> Req:
        params = recv.sampling_params
        params.normalize(self.tokenizer)
        req = Req(
            recv.rid,
            recv.input_ids,
            params,
            stream=recv.stream,
            return_logprob=recv.return_logprob,
            top_logprobs_num=recv.top_logprobs_num,
            input_text=recv.input_text,
        )
        error = self._validate(req)
        if error:
            req.finished_reason = {"type": "abort", "message": error}
            self._pending_outputs.append(req)
        else:
            self.waiting.append(req)
        return req

    def _validate(self, req: Req) -> Optional[str]:
        n = len(req.origin_input_ids)
        if n == 0:
            return "the prompt is empty"
        if n > self.max_req_input_len:
            return f"the prompt has {n} tokens, more than the maximum of {self.max_req_input_len}"
        vocab = self.model_config.vocab_size
        if min(req.origin_input_ids) < 0 or max(req.origin_input_ids) >= vocab:
            return f"input token ids must be in [0, {vocab})"
        return None

    def abort(self, msg: AbortReq):
        targets = [r for r in self.waiting + self.running if msg.abort_all or r.rid == msg.rid]
        for req in targets:
            req.finished_reason = {"type": "abort", "message": msg.message}
            if req in self.waiting:
                self.waiting.remove(req)
            else:
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
        """Run one forward step (if there is work) and return the outputs due."""
        if self.has_work:
            batch = self._schedule()
            if not batch.is_empty:
                result = self._run(batch)
                self._process_result(batch, result)
        due, self._pending_outputs = self._pending_outputs, []
        due += [r for r in self.running if due_for_output(r, self.server_args.stream_interval)]
        self._maybe_log_stats()
        return build_token_id_out(due)

    def _schedule(self) -> ScheduleBatch:
        batch, admitted = self.policy.build_step(self.running, self.waiting)
        for req in admitted:
            self.waiting.remove(req)
            self.running.append(req)
        return batch

    def _run(self, batch: ScheduleBatch) -> ForwardResult:
        out_cache_loc = self.cache.alloc_for_step(batch.items)
        while out_cache_loc is None:
            batch = self._shrink_for_memory(batch)
            if batch.is_empty:
                return ForwardResult([], None, None)
            out_cache_loc = self.cache.alloc_for_step(batch.items)
        self.forward_ct += 1
        result = self.runner.forward(batch.to_worker_batch(out_cache_loc))
        self.last_logits = result.logits
        if self.on_step_result is not None:
            self.on_step_result(batch, result)
        return result

    def _shrink_for_memory(self, batch: ScheduleBatch) -> ScheduleBatch:
        """Out of KV: first give back this step's newly admitted prefills, then retract decodes."""
        prefills = [it for it in batch.items if it.req.is_prefilling and it.req.kv_len == it.req.cached_prefix_len]
        if prefills:
            victim = prefills[-1].req
            self._requeue(victim)
        else:
            victim = pick_retract_victim(self.running)
            if victim is None:
                victim = self.running[0]
                victim.finished_reason = {"type": "abort", "message": "out of KV cache memory"}
                self.running.remove(victim)
                self.cache.release(victim)
                self._pending_outputs.append(victim)
            else:
                victim.retracted_count += 1
                self.num_retractions += 1
                logger.info("KV cache full: retracting request %s (%d output tokens)", victim.rid, len(victim.output_ids))
                self._requeue(victim)
        batch.items = [it for it in batch.items if it.req is not victim]
        return batch

    def _requeue(self, req: Req) -> None:
        self.running.remove(req)
        self.cache.release(req)
        self.waiting.insert(0, req)

    def _process_result(self, batch: ScheduleBatch, result: ForwardResult) -> None:
        sampled = 0
        for item in batch.items:
            req = item.req
            samples = item.samples
            req.kv_len = item.start + item.num_tokens
            if item.num_tokens > 1 or not req.output_ids:
                self._stats["prefill_tokens"] += item.num_tokens
            else:
                self._stats["decode_tokens"] += 1
            if not samples:
                continue
            token = result.next_token_ids[sampled]
            req.output_ids.append(token)
            if req.return_logprob and result.logprobs is not None:
                req.output_token_logprobs.append((result.logprobs[sampled], token))
                if req.top_logprobs_num and result.top_logprobs is not None:
                    req.output_top_logprobs.append(result.top_logprobs[sampled])
            sampled += 1
            req.check_finished(self.eos_token_ids, self.tokenizer, self.context_len)
            if req.finished:
                self.running.remove(req)
                self.cache.release(req)
                self._pending_outputs.append(req)
        self._stats["steps"] += 1

    # ------------------------------------------------------------------ logging
    def _maybe_log_stats(self) -> None:
        now = time.monotonic()
        if now - self._last_stats < STATS_LOG_INTERVAL_S or not self._stats["steps"]:
            return
        dt = now - self._last_stats
        used = self.runner.max_total_num_tokens - self.cache.available_tokens()
        logger.info(
            "steps %d, prefill %.1f tok/s, decode %.1f tok/s, running %d, waiting %d, KV usage %.2f",
            self._stats["steps"],
            self._stats["prefill_tokens"] / dt,
            self._stats["decode_tokens"] / dt,
            len(self.running),
            len(self.waiting),
            used / self.runner.max_total_num_tokens,
        )
        self._stats = {"prefill_tokens": 0, "decode_tokens": 0, "steps": 0}
        self._last_stats = now

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


# ---------------------------------------------------------------------------- process entry
def run_scheduler_process(server_args: ServerArgs, port_args, rank: int, pipe_writer) -> None:
    """Entry of a scheduler process: build everything, report readiness, serve forever."""
    import faulthandler
    import traceback

    from sglang.srt.managers.scheduler_io import SchedulerIO
    from sglang.srt.utils.process import configure_logger, kill_itself_when_parent_died

    configure_logger(server_args.log_level, f"Scheduler rank {rank}")
    faulthandler.enable()
    kill_itself_when_parent_died()
    try:
        tokenizer = None
        if not server_args.skip_tokenizer_init:
            from sglang.srt.utils.hf_transformers_utils import get_tokenizer

            tokenizer = get_tokenizer(server_args.tokenizer_path)
        scheduler = Scheduler(server_args, tokenizer=tokenizer)
        io = SchedulerIO(port_args)
    except Exception:
        pipe_writer.send({"status": "error", "error": traceback.format_exc()})
        raise
    pipe_writer.send({"status": "ready", "info": scheduler.ready_info()})
    logger.info("scheduler ready")
    while True:
        for msg in io.recv_all(block=not scheduler.has_work):
            reply = scheduler.handle_message(msg)
            if reply is not None:
                io.send_to_tokenizer.send_pyobj(reply)
        out = scheduler.step()
        if out is not None:
            io.send_to_detokenizer.send_pyobj(out)
