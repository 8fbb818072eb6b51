"""PD on a prefill server's pipeline stage k > 0: send this stage's layers' KV of every chunk.

Later stages hold no requests (managers/pp/stage.py); each micro-batch says which of its items are
PD requests (`StageBatch.pd_rooms`). This component keeps one KV sender per room on this rank:
after the stage's forward of a micro-batch it hands over each PD item's new positions (page
aligned; all of them on the item's last chunk, the one that samples) and, after the last chunk,
its `TransferDone`. Stage 0 decides everything else: it holds the request until the decode side
confirms every rank's part (so stage k's reads of its pool are over before stage 0 frees the
slots), and a failure anywhere reaches every rank through the decode side.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from sglang.srt.disaggregation.base.conn import BaseKVSender, BasePrefillKVManager
from sglang.srt.disaggregation.base.kv_poll import KVPoll
from sglang.srt.disaggregation.common import own_shard

logger = logging.getLogger(__name__)


class StagePrefillTransfer:
    """`manager`: this rank's transfer manager (factory.create_stage_transfer builds it)."""

    def __init__(self, runner, manager: BasePrefillKVManager, cp_rank: int = 0):
        self.req_to_token = runner.req_to_token_pool.req_to_token
        self.cp_mapping = runner.cp.mapping if runner.cp is not None else None
        self.cp_rank = cp_rank
        self.page = runner.kv_page_size
        self.manager = manager
        self.senders: dict[int, tuple[BaseKVSender, list]] = {}  # room -> (sender, [positions sent])

    def after_forward(self, batch) -> None:
        """`batch`: the StageBatch this stage just ran."""
        rooms: list[Optional[int]] = getattr(batch, "pd_rooms", None) or []
        wb = batch.worker_batch if rooms else None  # its ModelWorkerBatch (wire form)
        for i, room in enumerate(rooms):
            if room is None:
                continue
            entry = self.senders.get(room)
            if entry is None:
                entry = (self.manager.create_sender(room), [0])
                self.senders[room] = entry
            sender, sent = entry
            if wb.prefix_lens[i] == 0 or i in batch.prefix_slots:
                sent[0] = 0  # first step after an admission (again, after a retraction): send it all
            last = i in wb.sample_rows
            end = wb.prefix_lens[i] + wb.extend_lens[i]
            upto = end if last else end // self.page * self.page
            if upto > sent[0]:
                row = wb.req_pool_indices[i]
                slots = self.req_to_token[row, sent[0] : upto].numpy().astype(np.int64)
                positions = np.arange(sent[0], upto, dtype=np.int64)
                # under CP: this cp rank's shard, the positions it stores (as stage 0 does)
                sender.send(*own_shard(self.cp_mapping, self.cp_rank, positions, slots))
                sent[0] = upto
            if last:
                sender.finish(None)
        self._release_finished()

    def _release_finished(self) -> None:
        for room in [r for r, (s, _) in self.senders.items() if s.poll() in (KVPoll.Success, KVPoll.Failed)]:
            sender, _ = self.senders.pop(room)
            sender.release()
