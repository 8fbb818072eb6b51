"""What the scheduler reports: request progress as the BatchTokenIDOut message for the
detokenizer, and its throughput in the log (`StepStats`)."""

from __future__ import annotations

import logging
import time
from typing import Optional

from sglang.srt.managers.io_struct import BatchTokenIDOut, InputLogprobsOut
from sglang.srt.managers.scheduler.schedule_batch import Req, ScheduleBatch
from sglang.srt.metrics.scheduler_stats import BucketCounts, DecodeThroughput

logger = logging.getLogger(__name__)

STATS_LOG_INTERVAL_S = 10.0


def due_for_output(req: Req, stream_interval: int) -> bool:
    """Whether `req` has output to send this step.

    Finished requests always report. Every request reports its first token at once, streaming
    or not, so the TokenizerManager sees the time of the first token (TTFT metrics). After that
    streams report every `stream_interval` new tokens; non-streaming requests wait to finish.
    """
    if req.finished:
        return True
    unsent = len(req.output_ids) - req.sent_len
    if unsent <= 0:
        return False
    if req.sent_len == 0:
        return True
    return req.stream and unsent >= stream_interval


def build_token_id_out(reqs: list[Req]) -> Optional[BatchTokenIDOut]:
    """Collect the unsent tokens of `reqs` and mark them sent."""
    if not reqs:
        return None
    out = BatchTokenIDOut(
        rids=[],
        new_output_ids=[],
        finished_reasons=[],
        prompt_tokens=[],
        completion_tokens=[],
        cached_tokens=[],
        skip_special_tokens=[],
        spaces_between_special_tokens=[],
        no_stop_trim=[],
        stop_strs=[],
        output_token_logprobs=[],
        output_top_logprobs=[],
    )
    for req in reqs:
        start = req.sent_len
        params = req.sampling_params
        out.rids.append(req.rid)
        out.new_output_ids.append(req.output_ids[start:])
        out.finished_reasons.append(req.finished_reason)
        out.prompt_tokens.append(len(req.origin_input_ids))
        out.completion_tokens.append(len(req.output_ids))
        out.cached_tokens.append(req.cached_tokens)
        out.skip_special_tokens.append(params.skip_special_tokens)
        out.spaces_between_special_tokens.append(params.spaces_between_special_tokens)
        out.no_stop_trim.append(params.no_stop_trim)
        out.stop_strs.append(list(params.stop or []))
        if req.return_logprob:
            out.output_token_logprobs.append(req.output_token_logprobs[start:])
            out.output_top_logprobs.append(req.output_top_logprobs[start:] if req.top_logprobs_num else None)
        else:
            out.output_token_logprobs.append(None)
            out.output_top_logprobs.append(None)
        ids = req.output_token_ids_logprobs[start:] if req.token_ids_logprob is not None else None
        out.output_token_ids_logprobs.append(ids)
        out.input_logprobs.append(_input_logprobs_due(req))
        req.sent_len = len(req.output_ids)
    return out


def _input_logprobs_due(req: Req) -> Optional[InputLogprobsOut]:
    """The request's prompt logprobs when complete (or the request finished) and not sent yet."""
    lp = req.prompt_logprobs
    if lp is None or lp.sent or not (lp.done or req.finished):
        return None
    lp.sent = True
    return InputLogprobsOut(list(lp.token_logprobs), list(lp.top_logprobs), list(lp.token_ids_logprobs))


class StepStats:
    """Tokens prefilled and decoded and steps run since the last log line; a line is due every
    `interval_s` seconds in which a step ran, or with `decode_log_interval` (`--decode-log-interval`,
    upstream's) every that many steps that decoded. Also the /metrics figures (`state()`): decode
    throughput and each request's queue time (arrival to first admission into a step)."""

    def __init__(
        self, now: float, interval_s: float = STATS_LOG_INTERVAL_S, decode_log_interval: Optional[int] = None
    ):
        self.interval_s = interval_s
        self.decode_log_interval = decode_log_interval
        self.gen_throughput = DecodeThroughput()
        self.queue_time = BucketCounts()
        self._reset(now)

    def on_launch(self, batch: ScheduleBatch, now: float) -> None:
        """A step was scheduled: its requests seen for the first time in a step end their queue time."""
        self.gen_throughput.launch(now)
        for item in batch.items:
            if item.req.queued_s is None:
                item.req.queued_s = now - item.req.arrival_time
                self.queue_time.observe(item.req.queued_s)

    def state(self) -> dict:
        return {"gen_throughput": self.gen_throughput.value, "queue_time": self.queue_time.snapshot()}

    def _reset(self, now: float) -> None:
        self.since = now
        self.prefill_tokens = self.decode_tokens = self.steps = self.decode_steps = 0

    def add_step(self, batch: ScheduleBatch, now: Optional[float] = None) -> None:
        """Count a finished step (before its sampled tokens are appended)."""
        decoded = 0
        for item in batch.items:
            if item.num_tokens > 1 or not item.req.output_ids:
                self.prefill_tokens += item.num_tokens
            else:
                decoded += 1
        self.decode_tokens += decoded
        self.steps += 1
        self.decode_steps += decoded > 0
        self.gen_throughput.finish(time.monotonic() if now is None else now, decoded)

    def due(self, now: float) -> bool:
        if self.decode_log_interval is not None:
            return self.decode_steps >= self.decode_log_interval
        return self.steps > 0 and now - self.since >= self.interval_s

    def log(self, now: float, running: int, waiting: int, kv_usage: float) -> None:
        dt = now - self.since
        logger.info(
            "steps %d, prefill %.1f tok/s, decode %.1f tok/s, running %d, waiting %d, KV usage %.2f",
            self.steps,
            self.prefill_tokens / dt,
            self.decode_tokens / dt,
            running,
            waiting,
            kv_usage,
        )
        self._reset(now)
