"""ForwardBatch: what the model runner hands to a model for one forward pass.

The scheduler never touches tensors and the model never sees requests: the scheduler's
`ScheduleBatch` is turned into this object by `ModelRunner`.

Token layout is flat ("varlen"): the new tokens of all requests of the batch are concatenated in
request order. A decode request contributes exactly one token; an extend (prefill) request
contributes `extend_seq_lens[i]` tokens that follow `extend_prefix_lens[i]` tokens whose KV is
already in the pool (radix-cache hit or an earlier chunk). A batch may mix both kinds
(`ForwardMode.MIXED`); attention treats every request as "queries = the new tokens, keys = the
whole sequence so far", so one code path serves prefill, chunked prefill and decode.

Per-forward state other than the tokens: `cp_layout`, this rank's share of the batch under
context parallelism (`layers/context_parallel.py`, set by the model runner before the backend
sees the batch), and `attn_metadata`, the attention backend's own per-batch object (for the
torch-native family a `TorchNativeBatch`), set by `attn_backend.init_forward_metadata`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto
from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:
    from sglang.srt.layers.context_parallel import CPLayout
    from sglang.srt.mem_cache.req_to_token import ReqToTokenPool
    from sglang.srt.mem_cache.kv_pool import KVPool


class ForwardMode(IntEnum):
    EXTEND = auto()  # every request brings >= 1 new prompt tokens (prefill / chunked prefill)
    DECODE = auto()  # every request brings exactly one new token
    MIXED = auto()  # both in one batch
    IDLE = auto()  # no tokens on this rank, but it must join the collectives of the step

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE


@dataclass
class PPProxyTensors:
    """Activations handed from one pipeline stage to the next."""

    tensors: dict[str, torch.Tensor]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]


@dataclass(frozen=True)
class DPForwardInfo:
    """One lockstep forward of the attention-DP replicas (docs/dp_attention.md): what every
    replica brings (identical on every rank of the stage), and which replica this rank is in.

    `num_tokens[d]`: the new tokens of replica d's batch (0 for an IDLE forward);
    `num_logit_rows[d]`: its rows that need logits (its batch size; its tokens when all-token logits
    are asked for)."""

    replica: int
    num_tokens: tuple[int, ...]
    num_logit_rows: tuple[int, ...]

    @property
    def dp_size(self) -> int:
        return len(self.num_tokens)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)

    def token_offset(self, replica: Optional[int] = None) -> int:
        """First row of `replica`'s (default: this rank's) tokens in the FULL layout."""
        return sum(self.num_tokens[: self.replica if replica is None else replica])

    def logit_row_offset(self, replica: Optional[int] = None) -> int:
        return sum(self.num_logit_rows[: self.replica if replica is None else replica])


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    # [num_tokens] flat new tokens, their absolute positions and the KV slot each one writes.
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    # [batch_size] per request.
    req_pool_indices: torch.Tensor  # row of the request in req_to_token
    seq_lens: torch.Tensor  # prefix + new tokens (total KV length after this forward)
    extend_prefix_lens: torch.Tensor  # tokens already in the KV pool before this forward
    extend_seq_lens: torch.Tensor  # new tokens in this forward (1 for decode)
    # CPU copies (python ints) for loops and shapes without device syncs.
    seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int]
    extend_seq_lens_cpu: list[int]
    # Memory pools and the attention backend (set by the model runner).
    req_to_token_pool: "ReqToTokenPool"
    token_to_kv_pool: "KVPool"
    attn_backend: Any = None
    # Which tokens need logits: by default the last new token of each request.
    return_all_logits: bool = False
    # Flat token indices whose logits prompt logprobs need (set with return_all_logits; None: none).
    logprob_rows: Optional[torch.Tensor] = None
    pp_proxy_tensors: Optional[PPProxyTensors] = None
    # The attention backend's per-batch object (typed by the backend; the layers never read it).
    attn_metadata: Any = None
    # This rank's token layout when the batch runs context-parallel (None: cp 1).
    cp_layout: Optional["CPLayout"] = None
    # Every attention-DP replica's share of this lockstep forward (None: dp 1).
    dp: Optional[DPForwardInfo] = None

    @classmethod
    def idle(
        cls,
        dp: DPForwardInfo,
        req_to_token_pool: "ReqToTokenPool",
        token_to_kv_pool: "KVPool",
        attn_backend: Any,
        device: Optional[torch.device] = None,
    ) -> "ForwardBatch":
        """A batch with no tokens: a replica's part of a lockstep forward it has no work for."""
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return cls(
            forward_mode=ForwardMode.IDLE,
            batch_size=0,
            input_ids=empty,
            positions=empty,
            out_cache_loc=empty,
            req_pool_indices=empty,
            seq_lens=empty,
            extend_prefix_lens=empty,
            extend_seq_lens=empty,
            seq_lens_cpu=[],
            extend_prefix_lens_cpu=[],
            extend_seq_lens_cpu=[],
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool=token_to_kv_pool,
            attn_backend=attn_backend,
            dp=dp,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def last_token_indices(self) -> torch.Tensor:
        """Index into the flat token dimension of each request's last new token."""
        return torch.cumsum(self.extend_seq_lens, dim=0) - 1
