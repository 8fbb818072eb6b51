"""PD on a decode server's pipeline stage k > 0: receive this stage's layers' KV.

Later stages hold no requests (managers/pp/stage.py) and run no PD queues. Stage 0's rank of the
same tp rank decides everything: once it has allocated a request's slots it asks this rank (the
backend's stage request) to mirror the request's req_to_token row (the same slots of this stage's
pool) and to ask every prefill rank for this stage's layers into them; the prefill ranks report to
stage 0, which lands the request once every stage's part is in. A landed request's first decode
step then finds its prompt's slots in this stage's row (the pipeline sends a row's prefix slots
only after a radix-cache admission).
"""

from __future__ import annotations

import numpy as np
import torch

from sglang.srt.disaggregation.base.conn import BaseDecodeKVManager


class StageDecodeReceiver:
    """`manager`: this rank's transfer manager (factory.create_stage_transfer builds and links it)."""

    def __init__(self, runner, manager: BaseDecodeKVManager):
        self.req_to_token = runner.req_to_token_pool.req_to_token
        self.manager = manager
        manager.set_row_writer(self.write_row)

    def write_row(self, row: int, slots: np.ndarray) -> None:
        """(the backend's thread) The row is free on stage 0 and in no micro-batch in flight."""
        self.req_to_token[row, : len(slots)] = torch.from_numpy(np.asarray(slots, dtype=np.int64)).to(
            self.req_to_token.dtype
        )

    def after_forward(self, batch) -> None:
        """KV moves towards this stage, never from it."""
