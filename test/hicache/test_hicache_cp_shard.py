"""HiCache under context parallelism, one rank at a time (no processes): the host pool works in
the scheduler's virtual slots and copies, packs and unpacks only the rows the rank stores
(`CPShard` over `CPSlotMapping`), with the interleave dealing runs of tokens to ranks."""

from __future__ import annotations

import torch

from sglang.srt.mem_cache.cp_slots import CPSlotMapping
from sglang.srt.mem_cache.hicache.host_pool import CPShard, HostKVPool

MAP = CPSlotMapping(page_size=4, cp_size=2, interleave=2)  # virtual page 8


def test_rank_copies_its_rows_of_virtual_slots():
    src, dst = torch.arange(8, 24), torch.arange(24, 40)  # two virtual pages each
    for rank in range(2):
        buf = torch.full((20, 3), -1.0)  # this rank's physical rows (16 + a padding page)
        own = MAP.owner(src) == rank
        buf[MAP.local_slot(src[own])] = src[own].float()[:, None].expand(-1, 3)
        host = HostKVPool([buf], 32, 8, shard=CPShard(MAP, rank))
        assert host.buffers[0].shape[0] == (32 + 8) // 2 and host.page_bytes(8) == 4 * 3 * 4
        hs = host.alloc(16)
        host.backup(src, hs)
        host.restore(hs, dst)
        mine = MAP.owner(dst) == rank
        assert torch.equal(buf[MAP.local_slot(dst[mine]), 0], src[mine].float())
        data = host.pack(src)
        assert len(data) == host.page_bytes(16)
        buf[MAP.local_slot(dst[mine])] = -1.0
        host.unpack(dst[8:], data, skip=8)  # the second page only: rows of positions 8..15
        assert torch.equal(
            buf[MAP.local_slot(dst[mine & (torch.arange(16) >= 8)]), 0], src[8:][mine[8:]].float()
        )
        assert (buf[MAP.local_slot(dst[mine & (torch.arange(16) < 8)])] == -1).all()
