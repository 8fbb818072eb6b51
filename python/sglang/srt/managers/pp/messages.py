"""Typed messages of the pipeline ring (what one stage tells the next, and the last tells stage 0).

- `MsgType.BATCH` (stage k -> k+1): a `StageBatch`, everything a later stage needs to run one
  micro-batch without request objects: stage 0's `ModelWorkerBatch` (without input ids) and the
  `req_to_token` row updates for its mirror of stage 0's table.
- `MsgType.PROXY` (stage k -> k+1, right after its BATCH): the micro-batch's activations
  (`PPProxyTensors`: hidden_states + residual).
- `MsgType.OUTPUT` (last stage -> stage 0): a `StageOutput`, the sampled ids of one micro-batch.
- `MsgType.STOP` (round the ring): shut down (tests and clean exits).
- `MsgType.PING` (round the ring): keep-alive of an idle ring.
- `MsgType.TIERS`, `QUERY` (stage k -> k+1), `ANSWER` (last stage -> stage 0): HiCache's tier
  copies and L3 page reads (`hicache_ring.py`); `READ` never travels: a later stage's I/O thread
  puts it in its own inbox when a QUERY's pages are read.

The transport (`distributed/pp_comm.py`) carries a message's kind as a plain int; `MsgType` is
an `IntEnum`, so its members are those ints (and `MsgType.STOP` is the transport's stop kind).

Row updates: a request's row on a later stage must hold the slots of positions [0, seq_len) when its
micro-batch runs there. Each micro-batch brings this step's slots (`out_cache_loc`); the first step
after an admission (`start == cached_prefix_len`) also brings the slots of its cached prefix. Later
micro-batches reach every stage after earlier ones, so a row or slot reused by stage 0 is rewritten
on a stage only after every earlier micro-batch that used it has run there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Optional

import torch

from sglang.srt.managers.scheduler.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.forward_batch import DPForwardInfo
from sglang.srt.model_executor.model_runner import ForwardResult
from sglang.srt.model_executor.logprobs import InputLogprobs
from sglang.srt.model_executor.worker_batch import ModelWorkerBatch


class MsgType(IntEnum):
    BATCH = 1
    PROXY = 2
    OUTPUT = 3
    STOP = 4
    PING = 5
    TIERS = 6  # HiCache: stage 0's tier copies (hicache_ring.py)
    QUERY = 7  # HiCache: read these L3 pages into these host rows (a storage prefetch)
    ANSWER = 8  # HiCache: the last stage's answer to stage 0 (the pages every stage read)
    READ = 9  # HiCache, local: a later stage's I/O thread has read a QUERY's pages


@dataclass
class StageBatch:
    """One micro-batch as later stages see it (picklable): stage 0's `ModelWorkerBatch` in its wire
    form (below), the row updates, and the ring's bookkeeping."""

    mb_id: int
    # Wire form: no input ids or positions (only stage 0 embeds tokens; a later stage derives the
    # positions from prefix / extend lengths), `out_cache_loc` a list of this step's slots in item
    # order, `prompt_ids` empty lists unless a repetition penalty needs the prompt.
    worker_batch: ModelWorkerBatch
    # item index -> slots of [0, prefix_len), on the first step after an admission
    prefix_slots: dict[int, list[int]] = field(default_factory=dict)
    rids: list[str] = field(default_factory=list)  # for traces
    launched_at: float = 0.0  # wall time stage 0 started this micro-batch (bubble accounting)
    ring_was_empty: bool = False  # nothing else was in flight when stage 0 launched it
    stage_forward_s: list[float] = field(default_factory=list)  # forward time of each stage so far
    stage_bubble: list[Optional[float]] = field(default_factory=list)  # bubble ratio of each stage so far
    # PD disaggregation (prefill server): the bootstrap room of each item, None for others; empty
    # when no item is a PD request. Later stages send their layers' KV of these items.
    pd_rooms: list[Optional[int]] = field(default_factory=list)
    # attention DP: every replica's counts for this micro-batch (each stage runs it in lockstep with
    # the other replicas' micro-batch of the same id); None when dp = 1
    dp: Optional[DPForwardInfo] = None

    @classmethod
    def idle(cls, mb_id: int, dp: DPForwardInfo) -> "StageBatch":
        """A micro-batch with no tokens: this replica's part of a lockstep micro-batch in which
        another replica has work (every stage runs it as an IDLE forward)."""
        return cls(mb_id=mb_id, worker_batch=ModelWorkerBatch.empty(), dp=dp)

    @property
    def is_idle(self) -> bool:
        return not self.worker_batch.out_cache_loc

    @classmethod
    def from_schedule(
        cls, mb_id: int, batch: ScheduleBatch, wb: ModelWorkerBatch, req_to_token: torch.Tensor
    ) -> "StageBatch":
        """Build on stage 0 right after `Scheduler.schedule()` (rows already hold this step's slots)."""
        prefix_slots: dict[int, list[int]] = {}
        for i, item in enumerate(batch.items):
            if item.start > 0 and item.start == item.req.cached_prefix_len:
                prefix_slots[i] = req_to_token[item.req.req_pool_idx, : item.start].tolist()
        sampled = [batch.items[i].req for i in wb.sample_rows]
        wire = dataclasses.replace(
            wb,
            input_ids=[],
            positions=[],
            out_cache_loc=wb.out_cache_loc.tolist(),
            prompt_ids=[
                list(p) if req.sampling_params.repetition_penalty != 1.0 else []
                for p, req in zip(wb.prompt_ids, sampled)
            ],
            output_ids=[list(o) for o in wb.output_ids],  # a copy: stage 0 appends to the requests' lists
        )
        rids = [item.req.rid for item in batch.items]
        return cls(mb_id=mb_id, worker_batch=wire, prefix_slots=prefix_slots, rids=rids)

    @property
    def num_tokens(self) -> int:
        return len(self.worker_batch.out_cache_loc)

    def apply_rows(self, req_to_token: torch.Tensor) -> None:
        """Write this micro-batch's slots into a later stage's mirror of the req_to_token table."""
        wb = self.worker_batch
        loc = torch.tensor(wb.out_cache_loc, dtype=torch.int64)
        offset = 0
        for i, (row, start, n) in enumerate(zip(wb.req_pool_indices, wb.prefix_lens, wb.extend_lens)):
            prefix = self.prefix_slots.get(i)
            if prefix is not None:
                req_to_token[row, :start] = torch.tensor(prefix, dtype=torch.int64)
            req_to_token[row, start : start + n] = loc[offset : offset + n].to(req_to_token.device)
            offset += n

    def to_worker_batch(self) -> ModelWorkerBatch:
        """The runner's input on a later stage (input ids are zeros: only stage 0 embeds tokens)."""
        wb = self.worker_batch
        positions: list[int] = []
        for start, n in zip(wb.prefix_lens, wb.extend_lens):
            positions.extend(range(start, start + n))
        return dataclasses.replace(
            wb,
            input_ids=[0] * len(positions),
            positions=positions,
            out_cache_loc=torch.tensor(wb.out_cache_loc, dtype=torch.int64),
        )

    def trace_args(self, pp_rank: int) -> dict:
        """Trace event arguments (`chunk_len` / `prefix_len` when the micro-batch is one request,
        the keys `tools/pp_sim` fits chunk latencies from)."""
        wb = self.worker_batch
        args = {
            "mb": self.mb_id,
            "pp_rank": pp_rank,
            "num_tokens": self.num_tokens,
            "rids": list(self.rids),
            "extend_lens": list(wb.extend_lens),
            "prefix_lens": list(wb.prefix_lens),
        }
        if len(wb.extend_lens) == 1:
            args["chunk_len"], args["prefix_len"] = wb.extend_lens[0], wb.prefix_lens[0]
        return args


@dataclass
class StageOutput:
    """Sampled tokens of one micro-batch (rows in `sample_rows` order), last stage -> stage 0."""

    mb_id: int
    next_token_ids: list[int]
    logprobs: Optional[list[float]]
    top_logprobs: Optional[list]
    stage_forward_s: list[float] = field(default_factory=list)
    # the last stage's prompt logprobs of the batch's logprob_rows and token_ids_logprob entries
    input_logprobs: Optional[InputLogprobs] = None
    token_ids_logprobs: Optional[list] = None
    stage_bubble: list[Optional[float]] = field(default_factory=list)

    @classmethod
    def from_result(cls, batch: StageBatch, result: ForwardResult) -> "StageOutput":
        return cls(
            mb_id=batch.mb_id,
            next_token_ids=list(result.next_token_ids),
            logprobs=result.logprobs,
            top_logprobs=result.top_logprobs,
            stage_forward_s=list(batch.stage_forward_s),
            stage_bubble=list(batch.stage_bubble),
            input_logprobs=result.input_logprobs,
            token_ids_logprobs=result.token_ids_logprobs,
        )

    def to_forward_result(self) -> ForwardResult:
        return ForwardResult(
            self.next_token_ids,
            self.logprobs,
            self.top_logprobs,
            input_logprobs=self.input_logprobs,
            token_ids_logprobs=self.token_ids_logprobs,
        )
