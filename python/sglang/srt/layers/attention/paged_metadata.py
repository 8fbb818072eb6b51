"""How the torch-native backend walks a (non context-parallel) batch over the paged KV pool.

Built once per ForwardBatch and shared by all layers, for plain (MHA) and latent (MLA, DSA)
attention alike. Requests bringing one new token (decode, or a one-token chunk) are attended
together over their KV slots padded to the longest sequence; requests bringing several tokens
(prefill, chunked prefill) are attended one by one over the slots of their whole sequence (prefix
+ new tokens). For sparse (DSA) attention every token also knows its request's `req_to_token`
row, so top-k positions map straight to KV slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch import ForwardBatch


@dataclass
class PagedExtend:
    """One multi-token request: its new tokens [start, end) at positions prefix_len .. seq_len - 1."""

    start: int
    end: int
    prefix_len: int
    seq_len: int
    slots: torch.Tensor  # [seq_len] KV slots of the whole sequence


@dataclass
class PagedMetadata:
    all_single: bool  # every request brings exactly one token
    single_token_idx: Optional[
        torch.Tensor
    ]  # [n1] flat index of each single-token request (None if all_single)
    single_slots: Optional[torch.Tensor]  # [n1, max_len] slots, 0 past seq_len
    single_valid: Optional[torch.Tensor]  # [n1, max_len] bool; None when all lengths are equal
    extends: list[PagedExtend]
    token_req_rows: torch.Tensor  # [num_tokens] req_to_token row of each token's request
    token_positions: torch.Tensor  # [num_tokens] absolute position of each token
    max_seq_len: int


def build_paged_metadata(fb: "ForwardBatch") -> PagedMetadata:
    req_to_token = fb.req_to_token_pool.req_to_token
    device = req_to_token.device
    ext_lens, prefix_lens, seq_lens = fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu, fb.seq_lens_cpu
    rows = fb.req_pool_indices.to(device)
    single = [i for i, n in enumerate(ext_lens) if n == 1]
    all_single = len(single) == fb.batch_size
    single_idx = single_slots = single_valid = None
    if single:
        sel = rows if all_single else rows[torch.tensor(single, dtype=torch.int64, device=device)]
        lens = [seq_lens[i] for i in single]
        max_len = max(lens)
        single_slots = req_to_token[sel, :max_len]
        if min(lens) != max_len:
            lens_t = torch.tensor(lens, dtype=torch.int64, device=device)
            single_valid = torch.arange(max_len, device=device).unsqueeze(0) < lens_t.unsqueeze(1)
            single_slots = single_slots.masked_fill(~single_valid, 0)
        if not all_single:
            starts = [0]
            for n in ext_lens:
                starts.append(starts[-1] + n)
            single_idx = torch.tensor([starts[i] for i in single], dtype=torch.int64, device=device)
    extends: list[PagedExtend] = []
    start = 0
    for i, n in enumerate(ext_lens):
        if n > 1:
            slots = req_to_token[rows[i], : seq_lens[i]]
            extends.append(PagedExtend(start, start + n, prefix_lens[i], seq_lens[i], slots))
        start += n
    counts = torch.tensor(ext_lens, dtype=torch.int64, device=device)
    return PagedMetadata(
        all_single=all_single,
        single_token_idx=single_idx,
        single_slots=single_slots,
        single_valid=single_valid,
        extends=extends,
        token_req_rows=torch.repeat_interleave(rows, counts),
        token_positions=fb.positions.to(device),
        max_seq_len=max(seq_lens) if seq_lens else 0,
    )
