"""The Mooncake backend's control messages between ranks (ZMQ, pickled dataclasses):

decode rank --DecodeKVRequest------> every prefill rank   (its KV slots and buffer addresses)
prefill rank --TransferDone--------> each decode rank      (its part of the KV is written; the
                                                            first token from the entry rank)
decode rank --TransferComplete-----> every prefill rank    (all parts arrived: free your KV;
                                                            or ok=False: the request is gone)

Decode pipeline stages: stage 0's rank sends a StageKVRequest to the same tp rank of each later
stage, which mirrors the request's row and sends its own DecodeKVRequest (its pool, its layers;
`status_endpoint` stage 0's), so stage 0 collects every TransferDone (one per prefill rank and
decode stage) and alone confirms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from sglang.srt.disaggregation.base.messages import FirstToken
from sglang.srt.mem_cache.transfer_layout import KVRegion


@dataclass
class DecodeKVRequest:
    room: int
    decode_rank: int
    decode_tp_size: int
    status_endpoint: str  # where this decode rank receives TransferDone
    session_id: str  # its transfer-engine address
    dst_slots: np.ndarray  # int64, the KV slot of every prompt position on this decode rank
    regions: list[KVRegion]  # its KV buffers (layers, heads it holds)
    kv_dtype: str
    wall_time: float = 0.0
    decode_pp_rank: int = 0
    decode_pp_size: int = 1

    @property
    def key(self) -> tuple[int, int]:
        """Which decode rank's memory this describes: (tp rank, pipeline stage)."""
        return (self.decode_rank, self.decode_pp_rank)


@dataclass
class StageKVRequest:
    """Stage 0's decode rank -> the same tp rank of a later decode stage: ask the prefill ranks for
    your layers of `room` into `dst_slots` (after writing them into req_to_token `row`)."""

    room: int
    row: int
    dst_slots: np.ndarray
    prefill_endpoints: list[str]
    status_endpoint: str  # stage 0's rank: it collects the TransferDones
    decode_tp_size: int
    decode_pp_size: int
    wall_time: float = 0.0


@dataclass
class ChunkRecord:
    """One chunk's transfer on one prefill rank: `queued` is when its forward had finished (the
    chunk was handed to the transfer thread), `done` when its bytes were written (wall clock)."""

    tokens: int
    nbytes: int
    queued: float
    started: float
    done: float


@dataclass
class TransferDone:
    room: int
    prefill_key: tuple[int, int, int, int]
    ok: bool
    error: str = ""
    first_token: Optional[FirstToken] = None
    chunks: list[ChunkRecord] = field(default_factory=list)
    decode_key: tuple[int, int] = (0, 0)  # the DecodeKVRequest.key it answers


@dataclass
class TransferComplete:
    room: int
    decode_rank: int
    ok: bool
    error: str = ""
