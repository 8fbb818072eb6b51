"""Typed messages of PD disaggregation (every process boundary it crosses).

Bootstrap server (HTTP JSON): a prefill rank registers its `PrefillRankInfo`; the decode side
reads the list back (`PrefillTopology`). Between ranks (ZMQ, pickled dataclasses):

    decode rank --DecodeKVRequest------> every prefill rank   (its KV slots and buffer addresses)
    prefill rank --TransferDone--------> each decode rank      (its part of the KV is written; the
                                                                first token from the entry rank)
    decode rank --TransferComplete-----> every prefill rank    (all parts arrived: free your KV;
                                                                or ok=False: the request is gone)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

import numpy as np

from sglang.srt.mem_cache.transfer_layout import KVRegion

# A bootstrap host that means "no peer": the request runs with the fake backend (warm-up, health).
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


@dataclass(frozen=True)
class PrefillRankInfo:
    """What one prefill rank registers at its server's bootstrap server."""

    rank_ip: str
    rank_port: int  # ZMQ PULL endpoint of the rank's transfer manager
    session_id: str  # transfer-engine address ("ip:port"); "" for the fake backend
    tp_rank: int
    tp_size: int
    cp_rank: int
    cp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int
    page_size: int
    kv_dtype: str
    kv_kind: str  # "mha" | "mla" | "dsa"
    start_layer: int
    end_layer: int

    @property
    def key(self) -> tuple[int, int, int, int]:
        return (self.dp_rank, self.cp_rank, self.tp_rank, self.pp_rank)

    @property
    def world_size(self) -> int:
        return self.tp_size * self.cp_size * self.pp_size * self.dp_size

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.rank_ip}:{self.rank_port}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "PrefillRankInfo":
        names = {f.name for f in fields(cls)}
        missing = names - set(data)
        if missing:
            raise ValueError(f"rank registration lacks {sorted(missing)}")
        return cls(**{k: data[k] for k in names})


@dataclass(frozen=True)
class PrefillTopology:
    """Every rank of one prefill server (all of them registered)."""

    ranks: tuple[PrefillRankInfo, ...]

    @property
    def first(self) -> PrefillRankInfo:
        return self.ranks[0]


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


@dataclass
class FirstToken:
    """The prefill server's sampled first token (the upstream 'aux' data)."""

    token_id: int
    logprob: Optional[float] = None
    top_logprobs: Optional[list[tuple[float, int]]] = None


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


@dataclass
class TransferComplete:
    room: int
    decode_rank: int
    ok: bool
    error: str = ""


def decode_rank_info_note(req: DecodeKVRequest) -> dict[str, Any]:
    """A short description for logs."""
    return {"room": req.room, "decode_rank": req.decode_rank, "slots": int(req.dst_slots.size)}


def fake_bootstrap(obj):
    """A copy of a single GenerateReqInput that a PD server serves on its own (fake backend)."""
    import dataclasses
    import random

    params = dict(obj.sampling_params or {})
    params["max_new_tokens"] = max(2, params.get("max_new_tokens") or 0)  # the decode side runs a step too
    return dataclasses.replace(obj, bootstrap_host=FAKE_BOOTSTRAP_HOST, bootstrap_port=None,
                               bootstrap_room=random.getrandbits(62), sampling_params=params)  # fmt: skip
