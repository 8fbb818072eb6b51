"""What the prefill and decode components and the factory share: this rank's place and KV
regions, the network address, agreeing on poll results across the ranks of a stage."""

from __future__ import annotations

import os
import socket

import numpy as np
import torch

from sglang.srt.disaggregation.base.conn import RankPlace
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.transfer_layout import KVRegion, kv_regions


def pd_ip(host: str) -> str:
    """The address peers reach this rank on: $SGLANG_HOST_IP, else --host, else (wildcard host)
    the address of the interface that routes outwards."""
    ip = os.environ.get("SGLANG_HOST_IP")
    if ip:
        return ip
    if host not in ("0.0.0.0", "::", ""):
        return "127.0.0.1" if host == "localhost" else host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def rank_place(groups) -> RankPlace:
    return RankPlace(
        tp_rank=groups.attn_tp.rank,
        tp_size=groups.attn_tp.size,
        cp_rank=groups.attn_cp.rank,
        cp_size=groups.attn_cp.size,
        pp_rank=groups.pp.rank,
        pp_size=groups.pp.size,
        dp_rank=groups.dp_rank,
        dp_size=groups.layout.attn_dp,
    )


def own_shard(cp_mapping, cp_rank: int, positions: np.ndarray, slots: np.ndarray):
    """The prompt positions this CP rank stores and their physical slots, from the request's
    virtual slots (`cp_mapping`: the runner's CPSlotMapping; None without CP: everything)."""
    if cp_mapping is None:
        return positions, slots
    virt = torch.from_numpy(slots)
    own = cp_mapping.owner(virt) == cp_rank
    return positions[own.numpy()], cp_mapping.local_slot(virt[own]).numpy().astype(np.int64)


def kv_kind(pool) -> str:
    if isinstance(pool, DSATokenToKVPool):
        return "dsa"
    if isinstance(pool, MLATokenToKVPool):
        return "mla"
    return "mha"


def pool_regions(pool, total_kv_heads: int, place: RankPlace) -> list[KVRegion]:
    """This rank's KV buffers; MHA heads carry their global index (tp rank t holds heads
    [t·h, (t+1)·h) when the heads are split, head t·H/tp when they are replicated)."""
    offset = 0
    if isinstance(pool, MHATokenToKVPool):
        if pool.head_num * place.tp_size == total_kv_heads:
            offset = place.tp_rank * pool.head_num
        else:
            offset = place.tp_rank * total_kv_heads // place.tp_size
    return kv_regions(pool, head_offset=offset)


def agree(group, values: list[int]) -> list[int]:
    """Element-wise MIN over the ranks of `group` (pp-cp.md invariant 1: every rank acts on the
    same poll results). KVPoll.Failed is 0, so one rank's failure fails the request everywhere."""
    if group.size <= 1 or not values:
        return values
    t = torch.tensor(values, dtype=torch.int64, device=group.device)
    group.all_reduce(t, op="min")
    return [int(v) for v in t.tolist()]
