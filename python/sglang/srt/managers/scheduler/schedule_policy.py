"""Which requests run in the next forward step, within token, request and KV budgets.

One step = every running request that is due a decode token (one token each) + prefill work
from requests still prefilling (a chunked prompt first) and then from the waiting queue, up to
the prefill token budget; once a step prefills some prompts, another joins only while the step's
prompt tokens stay within `--prefill-pack-tokens` (so prompts that arrive together get their first
tokens one step after another). With short prompts first (`--short-prompt-first-tokens`), waiting
prompts that short go ahead of the chunked prompt's next chunk, in at most half of the budget. Decodes therefore keep running while a long prompt is chunk-prefilled.
Admission of a waiting request needs a free request slot and enough KV (free + evictable) for
its tokens plus a reserve for the decode growth of everything running; a request whose HiCache
storage prefetch the policy still waits for is passed over (the others go on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from sglang.srt.managers.scheduler.cache_manager import KVCacheManager
from sglang.srt.managers.scheduler.schedule_batch import Req, ScheduleBatch, ScheduledReq

# Fraction of the remaining max_new_tokens of running requests kept free for their decodes.
DECODE_RESERVE_RATIO = 0.3
LPM_MAX_QUEUE = 128  # longest-prefix-match ordering costs a tree walk per queued request

# Dynamic chunking: (fill length of the request, tokens already in its KV) -> this chunk's budget.
ChunkBudgetFn = Callable[[int, int], int]


@dataclass(frozen=True)
class StepBudget:
    prefill_tokens: int  # new prompt tokens per step (chunk size, capped by --max-prefill-tokens)
    chunked: bool  # False: a prompt longer than the budget runs whole, alone
    max_running_requests: int
    page_size: int
    # Short prompts first (--short-prompt-first-tokens): waiting prompts of at most this many
    # uncached tokens go ahead of a chunked prompt's next chunk, within the step's budget; 0: off.
    short_first_tokens: int = 0
    # --prefill-pack-tokens: a waiting prompt joins a step that already prefills others only while
    # the step's prompt tokens stay within this (the first still takes a whole chunk); 0: off.
    pack_tokens: int = 0


class SchedulePolicy:
    def __init__(
        self,
        policy: str,
        budget: StepBudget,
        cache: KVCacheManager,
        chunk_budget: Optional[ChunkBudgetFn] = None,
    ):
        if policy not in ("fcfs", "lpm"):
            raise ValueError(f"unknown schedule policy {policy!r}")
        self.policy = policy
        self.budget = budget
        self.cache = cache
        # Dynamic chunking: the step's prefill budget is the chunk size chosen for its first
        # prefill (the request being chunked); later prefills of the step share what is left.
        self.chunk_budget = chunk_budget

    # ------------------------------------------------------------------ ordering
    def order_waiting(self, waiting: list[Req]) -> list[Req]:
        if self.policy == "lpm" and 1 < len(waiting) <= LPM_MAX_QUEUE:
            # Longest cached prefix first; ties keep arrival order (sort is stable).
            return sorted(waiting, key=lambda r: -self.cache.match_prefix_len(r))
        return waiting

    # ------------------------------------------------------------------ one step
    def build_step(
        self,
        running: list[Req],
        waiting: list[Req],
        max_items: Optional[int] = None,
        max_decodes: Optional[int] = None,
    ) -> tuple[ScheduleBatch, list[Req]]:
        """Return the step's batch and the waiting requests admitted into it (now holding KV rows).

        Pipeline micro-batches: `max_items` caps the requests of the step
        (`--pp-max-micro-batch-size`), `max_decodes` its decodes (so decodes spread over the ring)."""
        batch = ScheduleBatch()
        cap = max_items if max_items is not None else 1 << 62
        decode_cap = min(cap, max_decodes if max_decodes is not None else cap)
        decode_tokens = 0
        for req in running:
            if req.schedulable and not req.is_prefilling and decode_tokens < decode_cap:
                batch.items.append(ScheduledReq(req, req.kv_len, 1))
                decode_tokens += 1

        prefill_left = self.budget.prefill_tokens
        admitted: list[Req] = []
        continuing = [r for r in running if r.schedulable and r.is_prefilling]
        if continuing and waiting and self.budget.short_first_tokens > 0 and self.budget.chunked:
            # The step's budget comes from the chunked prompt (dynamic chunking sizes it); short
            # prompts take up to half of it first, the chunked prompt's next chunk the rest.
            first = continuing[0]
            prefill_left = self._step_budget(batch, prefill_left, first.seqlen, first.kv_len)
            share = prefill_left // 2
            limit = self.budget.short_first_tokens
            # a prompt that short needs no prefix walk; a longer one may be short once its cached prefix is off
            shorts = [
                r for r in waiting if r.seqlen <= limit or r.seqlen - self.cache.match_prefix_len(r) <= limit
            ]
            used = self._admit_waiting(
                batch, running, shorts, share, cap, decode_tokens, admitted, whole_only=True
            )
            prefill_left -= used
        for req in continuing:  # requests in the middle of a chunked prefill continue first
            if prefill_left > 0 and len(batch.items) < cap:
                prefill_left = self._step_budget(batch, prefill_left, req.seqlen, req.kv_len)
                take = self._take(req, prefill_left, batch)
                if take:
                    batch.items.append(ScheduledReq(req, req.kv_len, take))
                    prefill_left -= take

        rest = [r for r in waiting if r not in admitted] if admitted else waiting
        if prefill_left <= 0 or not rest:
            return batch, admitted
        self._admit_waiting(
            batch, running, self.order_waiting(rest), prefill_left, cap, decode_tokens, admitted
        )
        return batch, admitted

    def _admit_waiting(
        self,
        batch: ScheduleBatch,
        running: list[Req],
        candidates: list[Req],
        prefill_left: int,
        cap: int,
        decode_tokens: int,
        admitted: list[Req],
        whole_only: bool = False,
    ) -> int:
        """Admit `candidates` in order into `batch` (appending to `admitted`) within `prefill_left`
        prompt tokens, the request cap and the KV budget.
        `whole_only` (short prompts first): `prefill_left` is a share of a step budget already sized,
        and only prompts that fit whole are taken. Returns the prompt tokens taken."""
        taken = 0
        packed = sum(item.num_tokens for item in batch.items if item.req.is_prefilling)
        reserve = self._decode_reserve(running)
        available = self.cache.available_tokens() - decode_tokens - batch.num_tokens
        for req in candidates:
            if len(running) + len(admitted) >= self.budget.max_running_requests or prefill_left <= 0:
                break
            if len(batch.items) >= cap:
                break
            if not self.cache.prefetch_ready(req):  # its storage prefetch is not done (the policy)
                continue
            cached = self.cache.match_prefix_len(req)
            remaining = req.seqlen - cached
            if not whole_only and packed and 0 < self.budget.pack_tokens < packed + remaining:
                break  # prefilled in a later step: the prompts before it get their first tokens sooner
            if whole_only:  # the share of a budget already sized by the chunked prompt
                if remaining > prefill_left:
                    break
            else:
                prefill_left = self._step_budget(batch, prefill_left, req.seqlen, cached)
            take = min(remaining, prefill_left) if self.budget.chunked else remaining
            if not self.budget.chunked and remaining > prefill_left and batch.has_prefill_items():
                break  # an over-budget prompt runs alone in a later step
            need = self._round_up(take) + self._round_up(
                min(req.sampling_params.max_new_tokens, 64) * DECODE_RESERVE_RATIO
            )
            something_runs = bool(running or admitted)
            if something_runs and need + reserve > available:
                break
            if not self.cache.admit(req):
                break
            admitted.append(req)
            take = min(take, req.remaining_len)
            batch.items.append(ScheduledReq(req, req.kv_len, take))
            prefill_left -= take
            taken += take
            packed += take
            available -= self._round_up(take)
            if take < req.remaining_len:
                break  # at most one partially prefilled request per step
        return taken

    def _step_budget(self, batch: ScheduleBatch, prefill_left: int, fill_len: int, prefix_len: int) -> int:
        """The prefill budget once this request is the step's first prefill (dynamic chunking)."""
        if self.chunk_budget is None or not self.budget.chunked or batch.has_prefill_items():
            return prefill_left
        return max(1, int(self.chunk_budget(fill_len, prefix_len)))

    def _take(self, req: Req, prefill_left: int, batch: ScheduleBatch) -> int:
        if self.budget.chunked:
            return min(req.remaining_len, prefill_left)
        return req.remaining_len if not batch.has_prefill_items() else 0

    def _decode_reserve(self, running: list[Req]) -> int:
        left = sum(max(0, r.sampling_params.max_new_tokens - len(r.output_ids)) for r in running)
        return int(left * DECODE_RESERVE_RATIO)

    def _round_up(self, tokens: float) -> int:
        page = self.budget.page_size
        return int(-(-int(tokens) // page) * page)


def pick_retract_victim(running: list[Req]) -> Optional[Req]:
    """The request to retract when decode KV runs out: the one with the least progress to lose
    (fewest output tokens), latest arrival breaking ties."""
    candidates = [r for r in running if not r.in_flight]
    if len(candidates) <= 1 and len(running) <= 1:
        return None
    if not candidates:
        return None
    return min(candidates, key=lambda r: (len(r.output_ids), -r.arrival_time))
