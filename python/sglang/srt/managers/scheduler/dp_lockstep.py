"""The attention-DP replicas of a stage step together (docs/dp_attention.md, "Lockstep").

Each replica schedules its own requests, but the layers whose weights span the replicas (MLPs and
MoE sharded over the whole tp group, an LM head over it) run collectives over every rank of the
stage, so every replica must run a forward at the same time, with every replica's token counts
known (`DPForwardInfo`). `DPLockstep` is the scheduler's component for that agreement: one small
all-gather of integers over the stage's tp group (CPU) per step.

- `agree(tokens, rows, has_work)`: after scheduling, every replica's counts; None when no replica
  has tokens (nobody runs a forward). A replica with no tokens while another has some runs an IDLE
  forward with the returned info (pp-cp.md invariant 2).
- `all_ready(ready, has_work, halt)` (pipeline ring): whether every replica has room to launch a
  micro-batch and some replica has work, decided before anyone schedules, so that either every
  replica launches (maybe IDLE) or none does; and whether every replica asked to halt (tests stop
  a ring only when all its replicas are idle and asked to).
- `any_work`: whether any replica had work at the last agreement; only when none had may an idle
  replica block waiting for messages (otherwise the others would wait for it in the next step).
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.model_executor.forward_batch import DPForwardInfo


class DPLockstep:
    def __init__(self, groups: ParallelGroups):
        if groups.layout.attn_dp < 2:
            raise ValueError("DPLockstep needs attention DP (dp_size > 1 with --enable-dp-attention)")
        self.stage = groups.tp  # every rank of every replica of this stage
        self.per_replica = groups.replica.size
        self.dp_rank = groups.dp_rank
        self.dp_size = groups.layout.attn_dp
        self.any_work = True  # until the first agreement: do not block
        self.num_agreements = 0
        self.num_idle_forwards = 0  # forwards this replica ran with no tokens of its own

    def state(self) -> dict:
        """Entries of `Scheduler.internal_state()` (and so of /get_server_info)."""
        return {"dp_lockstep_steps": self.num_agreements, "dp_idle_forwards": self.num_idle_forwards}

    def _per_replica(self, values: list[int]) -> list[list[int]]:
        """Every replica's values (its first rank's; the ranks of a replica agree)."""
        return self.stage.all_gather_ints(values)[:: self.per_replica]

    def all_ready(self, ready: bool, has_work: bool, halt: bool = False) -> tuple[bool, bool]:
        """(launch: every replica has room and some has work, halt: every replica asked to halt)."""
        rows = self._per_replica([int(ready), int(has_work), int(halt)])
        self.any_work = any(r[1] for r in rows)
        return all(r[0] for r in rows) and self.any_work, all(r[2] for r in rows)

    def agree(self, num_tokens: int, num_logit_rows: int, has_work: bool) -> Optional[DPForwardInfo]:
        rows = self._per_replica([num_tokens, num_logit_rows, int(has_work)])
        self.num_agreements += 1
        self.any_work = any(r[2] for r in rows)
        tokens = tuple(r[0] for r in rows)
        if not any(tokens):
            return None
        if num_tokens == 0:
            self.num_idle_forwards += 1
        return DPForwardInfo(
            replica=self.dp_rank, num_tokens=tokens, num_logit_rows=tuple(r[1] for r in rows)
        )
