"""The backend-neutral messages of PD: a prefill rank's registration at its server's bootstrap
server (`PrefillRankInfo`, read back by the decode side as a `PrefillTopology`) and the first token
the prefill side samples (`FirstToken`). A backend's own wire messages live in its folder."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Optional


@dataclass(frozen=True)
class PrefillRankInfo:
    """What one prefill rank registers at its server's bootstrap server."""

    rank_ip: str
    rank_port: int  # the control endpoint (ZMQ PULL) of the rank's transfer manager
    session_id: str  # transfer-engine address ("ip:port")
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
class FirstToken:
    """The prefill server's sampled first token (the upstream 'aux' data)."""

    token_id: int
    logprob: Optional[float] = None
    top_logprobs: Optional[list[tuple[float, int]]] = None
    # the first token's token_ids_logprob entries, and the prompt logprobs the prefill side
    # computed (managers/scheduler/prompt_logprobs.py: per prompt position from logprob_start_len
    # its (logprob, id), top alternatives and token_ids_logprob entries); None: not asked
    token_ids_logprobs: Optional[list[tuple[float, int]]] = None
    input_token_logprobs: Optional[list[tuple[Optional[float], int]]] = None
    input_top_logprobs: Optional[list] = None
    input_token_ids_logprobs: Optional[list] = None
