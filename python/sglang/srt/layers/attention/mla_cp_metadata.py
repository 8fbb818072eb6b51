"""Per-batch metadata of context-parallel latent attention (`mla_cp.py`), built once per ForwardBatch.

Request kinds come from the batch's `CPLayout`: FRESH and PREFIX requests (several new tokens)
are split over the cp ranks and handled as *extends* (each rank: its own queries against the
request's whole sequence, whose rows are gathered); REPLICATED requests (one new token, decodes)
are handled as *decodes* (each rank: all of them against the rows it stores, partial results
merged by LSE); replicated decodes are on every rank, split decodes (`CPLayout.split_decodes`) on
one rank each, their queries gathered first and their partials merged on the holder
(`DecodeSplit`).

One all-gather per layer moves, from every rank, (a) the new rows of the split tokens it holds
and (b) the cached prefix rows of the PREFIX requests that it stores; `GatherPlan` says where each
gathered row goes. Everything here is computed from data identical on every rank (the batch's CPU
lists, the slot mapping), so all ranks agree on sizes without exchanging them.

Segmented prefix gather (`CPLayout.kv_gather_segment` = S > 0, and the batch's PREFIX requests
have more than S cached rows in all): the early exchange carries the new split rows only, and the
prefix rows are gathered afterwards in rounds (`PrefixRound`) of at most S rows of the batch's flat
prefix buffer (the PREFIX requests' prefixes one after the other), each attended and merged by LSE
before the next one is gathered (`mla_cp_segments.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.layers.context_parallel import PREFIX, REPLICATED, CPLayout, GatherSpec

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch import ForwardBatch


@dataclass
class CPExtend:
    """A FRESH or PREFIX request: this rank's queries and where the request's rows come from."""

    global_start: int  # first new token in the batch's flat order
    num_tokens: int  # new tokens
    prefix_len: int
    local_start: int  # this rank's queries: local rows [local_start, local_start + local_count)
    local_count: int
    q_pos: torch.Tensor  # [local_count] absolute positions of this rank's queries
    prefix_offset: int  # first row of its prefix in the gathered prefix buffer


@dataclass
class GatherPlan:
    """Layout of the per-layer all-gather (rank order; rank r sends sizes[r] rows: its new split
    rows, then its stored prefix rows)."""

    sizes: list[int]
    new_local_rows: torch.Tensor  # this rank's local rows of split tokens (what it sends first)
    prefix_slots: torch.Tensor  # this rank's physical slots of prefix rows (what it sends next)
    new_src: torch.Tensor  # rows of the gathered tensor that are new split tokens ...
    new_dst: torch.Tensor  # ... and their batch-global flat index
    prefix_src: torch.Tensor  # rows of the gathered tensor that are prefix rows ...
    prefix_dst: torch.Tensor  # ... and their row in the prefix buffer
    prefix_total: int


@dataclass
class DecodeSplit:
    """Split decodes: where their queries come from and where their merged outputs go."""

    spec: GatherSpec  # the decode queries each rank holds (gathered before the attention)
    gathered_idx: torch.Tensor  # decode index of each gathered row
    holders: torch.Tensor  # [n1] rank holding each decode
    local_rows: torch.Tensor  # [n1] the holder's local row of each decode


@dataclass
class PrefixRound:
    """One round of the segmented prefix gather: rows [start, end) of the flat prefix buffer."""

    start: int
    end: int
    sizes: list[int]  # rows each rank sends (the ones it stores)
    my_slots: torch.Tensor  # physical slots of the rows this rank sends
    dst: torch.Tensor  # [sum(sizes)] row within the round of each gathered row (rank order)


@dataclass
class MLACPMetadata:
    own_global_idx: torch.Tensor  # new tokens this rank stores ...
    own_slots: torch.Tensor  # ... at these physical slots
    extends: list[CPExtend]
    plan: GatherPlan
    repl_local_rows: torch.Tensor  # local rows of replicated tokens ...
    repl_global_idx: torch.Tensor  # ... and their global index
    decode_rows: Optional[torch.Tensor]  # [n1] local rows of the decodes (replicated; None if split)
    decode_req_rows: Optional[torch.Tensor]  # [n1] their req_to_token rows
    decode_slots: Optional[torch.Tensor]  # [n1, max_len] physical slots of the rows stored here (0 = pad)
    decode_valid: Optional[torch.Tensor]  # [n1, max_len] bool
    decode_pos: Optional[torch.Tensor]  # [max_len] positions of those columns
    max_seq_len: int  # longest sequence of the batch (the same on every rank)
    decode_split: Optional[DecodeSplit] = None  # split decodes (`decode_rows` is None)
    rounds: Optional[list[PrefixRound]] = None  # segmented prefix gather (None: one gather)


def _owned_positions(layout: CPLayout, length: int, rank: int) -> torch.Tensor:
    """Positions < length stored on `rank` (ascending)."""
    owner = layout.slot_mapping.position_owner(torch.arange(length, dtype=torch.int64))
    return torch.nonzero(owner == rank).flatten()


def _gather_plan(layout: CPLayout, fb: "ForwardBatch", rows: list[int]) -> tuple[GatherPlan, list[int]]:
    spec = layout.split_spec()
    table = fb.req_to_token_pool.req_to_token
    prefix_reqs = [i for i, k in enumerate(layout.kinds) if k == PREFIX]
    offsets, total = [], 0
    for i in prefix_reqs:
        offsets.append(total)
        total += layout.prefix_lens[i]
    sizes, new_src, new_dst, prefix_src, prefix_dst = [], [], [], [], []
    my_slots: list[torch.Tensor] = []
    cursor = 0
    for r in range(layout.cp_size):
        n_new = spec.sizes[r]
        new_src.append(torch.arange(cursor, cursor + n_new))
        new_dst.append(spec.global_idx[sum(spec.sizes[:r]) : sum(spec.sizes[: r + 1])])
        n_pre = 0
        for i, off in zip(prefix_reqs, offsets):
            pos = _owned_positions(layout, layout.prefix_lens[i], r)
            prefix_dst.append(off + pos)
            n_pre += int(pos.numel())
            if r == layout.cp_rank and pos.numel():
                virtual = table[rows[i]].index_select(0, pos.to(table.device)).to(torch.int64)
                my_slots.append(layout.slot_mapping.local_slot(virtual))
        prefix_src.append(torch.arange(cursor + n_new, cursor + n_new + n_pre))
        sizes.append(n_new + n_pre)
        cursor += n_new + n_pre
    empty = torch.empty(0, dtype=torch.int64)
    cat = lambda parts: torch.cat(parts) if parts else empty  # noqa: E731
    plan = GatherPlan(
        sizes,
        spec.local_rows,
        cat(my_slots),
        cat(new_src),
        cat(new_dst),
        cat(prefix_src),
        cat(prefix_dst),
        total,
    )
    offset_of = {i: off for i, off in zip(prefix_reqs, offsets)}
    return plan, [offset_of.get(i, 0) for i in range(layout.batch_size)]


def _prefix_rounds(layout: CPLayout, fb: "ForwardBatch", rows: list[int], segment: int) -> list[PrefixRound]:
    """The rounds of at most `segment` rows covering the flat prefix buffer of the PREFIX requests."""
    table = fb.req_to_token_pool.req_to_token
    owned, my_slots, total = [], [], 0  # owned[r]: flat prefix rows stored on rank r (ascending)
    prefix_reqs = [i for i, k in enumerate(layout.kinds) if k == PREFIX]
    for r in range(layout.cp_size):
        parts, off = [], 0
        for i in prefix_reqs:
            pos = _owned_positions(layout, layout.prefix_lens[i], r)
            parts.append(off + pos)
            if r == layout.cp_rank and pos.numel():
                virtual = table[rows[i]].index_select(0, pos.to(table.device)).to(torch.int64)
                my_slots.append(layout.slot_mapping.local_slot(virtual))
            off += layout.prefix_lens[i]
        owned.append(torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64))
        total = off
    mine = torch.cat(my_slots) if my_slots else torch.empty(0, dtype=torch.int64)
    out = []
    for a in range(0, total, segment):
        b = min(total, a + segment)
        sizes, dst = [], []
        for r in range(layout.cp_size):
            lo, hi = (int(torch.searchsorted(owned[r], x)) for x in (a, b))
            sizes.append(hi - lo)
            dst.append(owned[r][lo:hi] - a)
            if r == layout.cp_rank:
                slots = mine[lo:hi]
        out.append(PrefixRound(a, b, sizes, slots, torch.cat(dst)))
    return out


def build_mla_cp_metadata(fb: "ForwardBatch", layout: CPLayout) -> MLACPMetadata:
    """This rank's view of the batch for CP latent attention (kept by the backend per batch)."""
    if layout.slot_mapping is None or layout.group is None:
        raise ValueError("a CP layout used for attention needs its group and slot mapping")
    mapping = layout.slot_mapping
    table = fb.req_to_token_pool.req_to_token
    dev = table.device
    owner, local = mapping.to_physical(fb.out_cache_loc.to(torch.int64))
    if not torch.equal(owner, mapping.position_owner(fb.positions.to(owner.device))):
        raise RuntimeError("CP: KV slots are not aligned to virtual pages (slot owner != position owner)")
    own_global_idx = torch.nonzero(owner == layout.cp_rank).flatten()
    rows = fb.req_pool_indices.tolist()
    plan, prefix_offsets = _gather_plan(layout, fb, rows)
    extends, decodes = [], []
    for i, kind in enumerate(layout.kinds):
        if kind == REPLICATED:
            decodes.append(i)
            continue
        pre = layout.prefix_lens[i]
        extends.append(
            CPExtend(
                layout.starts[i],
                layout.ext_lens[i],
                pre,
                layout.local_starts[i],
                layout.local_counts[i],
                pre + layout.local_offsets[i],
                prefix_offsets[i],
            )
        )
    repl_local_rows = torch.nonzero(layout.holder_rank[layout.local_idx] < 0).flatten()
    md = MLACPMetadata(
        own_global_idx,
        local[own_global_idx],
        extends,
        plan,
        repl_local_rows,
        layout.local_idx[repl_local_rows],
        None,
        None,
        None,
        None,
        None,
        max(fb.seq_lens_cpu) if fb.seq_lens_cpu else 0,
    )
    segment = layout.kv_gather_segment
    if segment > 0 and plan.prefix_total > segment:
        md.rounds = _prefix_rounds(layout, fb, rows, segment)
    if decodes:
        seqs = [layout.prefix_lens[i] + 1 for i in decodes]
        lens = [mapping.local_token_count(s, layout.cp_rank) for s in seqs]
        max_len = max(lens)
        pos = _owned_positions(layout, max(seqs), layout.cp_rank)[:max_len].to(dev)
        req_rows = torch.tensor([rows[i] for i in decodes], dtype=torch.int64, device=dev)
        valid = torch.arange(max_len, device=dev).unsqueeze(0) < torch.tensor(lens, device=dev).unsqueeze(1)
        virtual = table.index_select(0, req_rows).index_select(1, pos).to(torch.int64)
        md.decode_rows, md.decode_split = _decode_rows(layout, decodes)
        md.decode_req_rows = req_rows
        md.decode_slots = mapping.local_slot(virtual).masked_fill(~valid, 0)
        md.decode_valid = valid
        md.decode_pos = pos
    return md


def _decode_rows(layout: CPLayout, decodes: list[int]):
    """(local rows of replicated decodes, None) or (None, how split decodes move)."""
    global_idx = torch.tensor([layout.starts[i] for i in decodes], dtype=torch.int64)
    holders = layout.holder_rank[global_idx]
    if not bool((holders >= 0).all()):
        return torch.tensor([layout.local_starts[i] for i in decodes], dtype=torch.int64), None
    spec = layout.gather_spec(global_idx)
    pos = torch.full((layout.num_tokens,), -1, dtype=torch.int64)
    pos[global_idx] = torch.arange(global_idx.numel())
    return None, DecodeSplit(spec, pos[spec.global_idx], holders, layout.holder_row[global_idx])
