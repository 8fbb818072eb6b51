"""KV-cache sharding across context-parallel (CP) ranks: the virtual slot space and its mapping.

Every CP rank runs an identical scheduler whose allocator, `req_to_token` table and radix cache work
in ONE *virtual* slot space with virtual page size `page_size · cp`. Each rank physically stores
only its share: a virtual page (virtual block) b is made of `cp` physical pages, one per rank,
and each rank's pool holds `page_size` slots per virtual page.

Inside a virtual block, tokens are dealt to ranks in runs of `interleave` tokens (the seed's
"cp_kv_cache_interleave_size"); with the offset o = v % (page_size · cp):

    local block index   lb     = o // interleave
    owner rank                 = lb % cp
    local physical slot        = b · page_size + (lb // cp) · interleave + o % interleave

A request's tokens fill whole virtual pages in order (and radix-cache prefixes are whole virtual
pages), so position p of a request sits at offset p % (page_size · cp) and is owned by rank
(p // interleave) % cp. A request of T tokens reserves ceil(T / (page·cp)) virtual pages, i.e.
at most ceil(T / cp) + page_size physical slots on every rank.

Pure functions, no process groups: unit-tested exhaustively in test/unit/test_context_parallel.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class CPSlotMapping:
    """The virtual -> (owner rank, physical slot) map of one CP group."""

    page_size: int  # physical page size of each rank's pool
    cp_size: int
    interleave: int = 1

    def __post_init__(self) -> None:
        if self.page_size < 1 or self.cp_size < 1 or self.interleave < 1:
            raise ValueError(f"page_size, cp_size and interleave must be >= 1, got {self}")
        if self.page_size % self.interleave:
            raise ValueError(
                f"--cp-kv-cache-interleave-size ({self.interleave}) must divide --page-size ({self.page_size})"
            )

    @property
    def virtual_page_size(self) -> int:
        """Page size of the scheduler's (virtual) allocator and radix cache."""
        return self.page_size * self.cp_size

    def physical_pool_size(self, virtual_size: int) -> int:
        """Usable physical slots per rank for a virtual pool of `virtual_size` slots (a whole
        number of virtual pages); the KV buffers additionally hold one padding page."""
        if virtual_size % self.virtual_page_size:
            raise ValueError(f"virtual size {virtual_size} is not a multiple of {self.virtual_page_size}")
        return virtual_size // self.cp_size

    # ------------------------------------------------------------------ slots
    @property
    def _shifts(self) -> Optional[tuple[int, int, int]]:
        """log2 of (page_size, cp_size, interleave) when all three are powers of two (the usual
        case): the maps then use shifts and masks (int64 division is scalar and ~10x slower; a
        decode step maps every selected position of every request)."""
        values = (self.page_size, self.cp_size, self.interleave)
        if all(v & (v - 1) == 0 for v in values):
            return tuple(v.bit_length() - 1 for v in values)  # type: ignore[return-value]
        return None

    def owner(self, virtual_slots: torch.Tensor) -> torch.Tensor:
        """Rank that stores each virtual slot."""
        shifts = self._shifts
        if shifts is not None:
            return (virtual_slots >> shifts[2]) & (self.cp_size - 1)  # page_size·cp is a multiple
        offset = virtual_slots % self.virtual_page_size
        return (offset // self.interleave) % self.cp_size

    def local_slot(self, virtual_slots: torch.Tensor) -> torch.Tensor:
        """Physical slot of each virtual slot in its owner's pool."""
        shifts = self._shifts
        if shifts is not None:
            page, cp, il = shifts
            block = virtual_slots >> (page + cp)
            offset = virtual_slots & (self.virtual_page_size - 1)
            within = ((offset >> (il + cp)) << il) | (offset & (self.interleave - 1))
            return (block << page) | within
        block = virtual_slots // self.virtual_page_size
        offset = virtual_slots % self.virtual_page_size
        within = (offset // (self.interleave * self.cp_size)) * self.interleave + offset % self.interleave
        return block * self.page_size + within

    def to_physical(self, virtual_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(owner rank, physical slot) of each virtual slot."""
        return self.owner(virtual_slots), self.local_slot(virtual_slots)

    def to_virtual(self, rank: int, physical_slots: torch.Tensor) -> torch.Tensor:
        """Inverse of `to_physical` for the slots rank `rank` owns."""
        block = physical_slots // self.page_size
        within = physical_slots % self.page_size
        lb_over_cp, rest = within // self.interleave, within % self.interleave
        offset = (lb_over_cp * self.cp_size + rank) * self.interleave + rest
        return block * self.virtual_page_size + offset

    # ------------------------------------------------------------------ positions
    def position_owner(self, positions: torch.Tensor) -> torch.Tensor:
        """Owner rank of token positions of a request whose KV starts at a virtual page boundary."""
        shifts = self._shifts
        if shifts is not None:
            return (positions >> shifts[2]) & (self.cp_size - 1)
        return (positions // self.interleave) % self.cp_size

    def local_token_count(self, seq_len: int, rank: int) -> int:
        """Tokens of a `seq_len`-token request stored on `rank` (vLLM's get_cp_local_seq_lens)."""
        run = self.interleave * self.cp_size
        base = (seq_len // run) * self.interleave
        rem = seq_len - base * self.cp_size
        return base + min(max(rem - rank * self.interleave, 0), self.interleave)

    def reserved_physical_slots(self, seq_len: int) -> int:
        """Physical slots a `seq_len`-token request reserves on every rank (whole virtual pages)."""
        pages = -(-seq_len // self.virtual_page_size)
        return pages * self.page_size


def plan_virtual_pool(tokens: int, mapping: CPSlotMapping, per_rank: bool) -> tuple[int, int]:
    """(virtual pool size, physical slots per rank) for a KV budget of `tokens`.

    `per_rank=True`: `tokens` is what one rank's memory holds (a memory-derived plan), so the
    virtual capacity is cp times larger; `per_rank=False`: `tokens` is the total the scheduler may
    use (`--max-total-tokens`). The virtual size is a whole number of virtual pages."""
    vps = mapping.virtual_page_size
    virtual = (tokens * mapping.cp_size if per_rank else tokens) // vps * vps
    if virtual < 2 * vps:
        raise ValueError(
            f"KV pool too small for context parallelism: {tokens} tokens give fewer than 2 virtual pages "
            f"of {vps} (page size × cp size); raise --max-total-tokens"
        )
    return virtual, mapping.physical_pool_size(virtual)


def physical_kv_state(mapping: CPSlotMapping, virtual_total: int, virtual_free: int) -> dict:
    """Per-rank physical KV numbers for `internal_state`: allocation is in whole virtual pages, so
    every rank reserves the same number of physical slots (virtual / cp)."""
    return {
        "cp_size": mapping.cp_size,
        "kv_physical_tokens_per_rank": virtual_total // mapping.cp_size,
        "kv_physical_used_per_rank": (virtual_total - virtual_free) // mapping.cp_size,
    }
