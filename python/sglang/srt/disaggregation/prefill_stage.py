"""PD on a prefill server's pipeline stage k > 0: send this stage's layers' KV of every chunk.

Later stages hold no requests (managers/pp/stage.py); each micro-batch says which of its items are
PD requests (`StageBatch.pd_rooms`). This component keeps one `KVSender` per room on this rank:
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

from sglang.srt.disaggregation.common import kv_kind, make_data_plane, pd_ip, pool_regions, rank_place
from sglang.srt.disaggregation.conn import KVSender, PrefillKVManager
from sglang.srt.disaggregation.kv_poll import KVPoll

logger = logging.getLogger(__name__)


class StagePrefillTransfer:
    def __init__(self, server_args, groups, runner):
        self.place = rank_place(groups)
        self.req_to_token = runner.req_to_token_pool.req_to_token
        self.page = runner.kv_page_size
        pool = runner.token_to_kv_pool
        regions = pool_regions(pool, runner.model_config.num_key_value_heads, self.place)
        ip = pd_ip(server_args.host)
        plane = make_data_plane("mooncake", ip, server_args.disaggregation_ib_device, regions)
        host = "127.0.0.1" if server_args.host in ("0.0.0.0", "::", "") else server_args.host
        info = dict(page_size=server_args.page_size, kv_kind=kv_kind(pool),
                    start_layer=pool.start_layer, end_layer=pool.end_layer)  # fmt: skip
        self.manager = PrefillKVManager(self.place, ip, regions, plane, str(pool.dtype).replace("torch.", ""), info,
                                        f"http://{host}:{server_args.disaggregation_bootstrap_port}")  # fmt: skip
        self.manager.start()
        self.senders: dict[int, tuple[KVSender, list]] = {}  # room -> (sender, [positions sent])

    def after_forward(self, batch) -> None:
        """`batch`: the StageBatch this stage just ran."""
        rooms: list[Optional[int]] = getattr(batch, "pd_rooms", None) or []
        for i, room in enumerate(rooms):
            if room is None:
                continue
            entry = self.senders.get(room)
            if entry is None:
                entry = (self.manager.create_sender(room), [0])
                self.senders[room] = entry
            sender, sent = entry
            if batch.prefix_lens[i] == 0 or i in batch.prefix_slots:
                sent[0] = 0  # first step after an admission (again, after a retraction): send it all
            last = i in batch.sample_rows
            end = batch.prefix_lens[i] + batch.extend_lens[i]
            upto = end if last else end // self.page * self.page
            if upto > sent[0]:
                row = batch.req_pool_indices[i]
                slots = self.req_to_token[row, sent[0] : upto].numpy().astype(np.int64)
                sender.send(np.arange(sent[0], upto, dtype=np.int64), slots)
                sent[0] = upto
            if last:
                sender.finish(None)
        self._release_finished()

    def _release_finished(self) -> None:
        for room in [r for r, (s, _) in self.senders.items() if s.poll() in (KVPoll.Success, KVPoll.Failed)]:
            sender, _ = self.senders.pop(room)
            self.manager.release(sender)
