"""What the scheduler does when a step's KV slots do not fit: give back this step's newly admitted
prefills first, then retract running decodes (their output is kept: re-admission re-prefills
prompt + output, so greedy output and a grammar's matcher stay where they were), and as a last
resort abort a request."""

from __future__ import annotations

import logging
from typing import Any

from sglang.srt.managers.scheduler.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler.schedule_policy import pick_retract_victim

logger = logging.getLogger(__name__)


def shrink_for_memory(sched: Any, batch: ScheduleBatch) -> ScheduleBatch:
    """Out of KV: first give back this step's newly admitted prefills, then retract decodes.
    `sched`: the Scheduler (its running list, cache, requeue and pending outputs)."""
    prefills = [
        it for it in batch.items if it.req.is_prefilling and it.req.kv_len == it.req.cached_prefix_len
    ]
    if prefills:
        victim = prefills[-1].req
        sched._requeue(victim)
    else:
        victim = pick_retract_victim(sched.running)
        if victim is None and any(r.in_flight for r in sched.running):
            batch.items = []  # wait for in-flight steps to finish and free memory
            return batch
        if victim is None:
            victim = sched.running[0]
            victim.finished_reason = {"type": "abort", "message": "out of KV cache memory"}
            sched.running.remove(victim)
            sched.cache.release(victim)
            sched._pending_outputs.append(victim)
        else:
            victim.retracted_count += 1
            sched.num_retractions += 1
            logger.info(
                "KV cache full: retracting request %s (%d output tokens)",
                victim.rid,
                len(victim.output_ids),
            )
            sched._requeue(victim)
    batch.items = [it for it in batch.items if it.req is not victim]
    return batch
