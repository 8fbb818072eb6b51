"""Context parallelism: the collectives that move a batch's rows between the ranks of a CP group.

`GatherSpec` + `start_gather`: an async, padded all-gather of the rows each rank holds of some set
of tokens (K/V per layer, queries, hidden states); `CPLayout` (`context_parallel.py`) derives the
specs. `exchange_to_holders`: an all-to-all that sends each row to the one rank that holds its
token (the partial attentions of split queries go to their holders, which merge only their own
rows: cp× fewer bytes than an all-gather of every partial to every rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from sglang.srt.distributed.group_coordinator import GroupCoordinator

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class GatherSpec:
    """A set of tokens to assemble from the ranks that hold them.

    Rank r contributes `local_rows[r]` (rows of its local tensor); the gathered rows are the
    contributions of rank 0, 1, ... concatenated, and `global_idx[j]` is the batch-global flat
    index of gathered row j."""

    sizes: list[int]
    local_rows: torch.Tensor  # this rank's contributing rows
    global_idx: torch.Tensor  # [sum(sizes)]

    @property
    def total(self) -> int:
        return int(sum(self.sizes))


class PendingGather:
    """An all-gather in flight (padded to the largest contribution); `wait()` trims the padding."""

    def __init__(
        self, work: Any, buffer: torch.Tensor, sizes: list[int], local: Optional[torch.Tensor] = None
    ):
        self.work, self.buffer, self.sizes, self.local = work, buffer, sizes, local
        self.on_wait: Optional[Any] = None  # a probe's hook, called on wait (tests: overlap traces)

    def wait(self) -> torch.Tensor:
        """[sum(sizes), ...] rows in rank order."""
        if self.on_wait is not None:
            self.on_wait()
        if self.local is not None:
            return self.local
        if self.work is not None:
            self.work.wait()
            self.work = None
        parts = [self.buffer[r, :n] for r, n in enumerate(self.sizes)]
        return torch.cat(parts) if len(parts) > 1 else parts[0]


def start_gather(group: "GroupCoordinator", rows: torch.Tensor, sizes: list[int]) -> PendingGather:
    """Asynchronously all-gather `rows` (this rank's contribution, `sizes[group.rank]` rows) over
    `group`: every rank pads to max(sizes), one `all_gather_single(async_op=True)`."""
    if group.size == 1:
        return PendingGather(None, rows, sizes, local=rows)
    if rows.shape[0] != sizes[group.rank]:
        raise ValueError(f"gather: this rank has {rows.shape[0]} rows, the layout says {sizes[group.rank]}")
    longest = max(sizes)
    tail = tuple(rows.shape[1:])
    if longest == 0:
        return PendingGather(None, rows.new_empty((group.size, 0) + tail), sizes)
    send = rows.contiguous()
    if send.shape[0] < longest:
        send = torch.cat([send, send.new_zeros((longest - send.shape[0],) + tail)])
    buffer = send.new_empty((group.size, longest) + tail)
    flat = buffer.view((group.size * longest,) + tail)
    work = _all_gather_single(flat, send, group=group.device_group, async_op=True)
    return PendingGather(work, buffer, sizes)


def exchange_to_holders(
    group: "GroupCoordinator", rows: torch.Tensor, holders: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Send row j of `rows` [n, ...] (every rank has the same n rows, in the same order) to rank
    `holders[j]`, with one `all_to_all_single` over `group`; `holders` is identical on every rank,
    so no counts are exchanged. Returns (mine: indices j held by this rank, ascending; received
    [group.size, len(mine), ...]: rank r's copy of those rows at [r])."""
    holders = holders.to(torch.int64).cpu()
    order = torch.argsort(holders, stable=True)
    counts = torch.bincount(holders, minlength=group.size).tolist()
    first = sum(counts[: group.rank])
    mine = order[first : first + counts[group.rank]]
    tail = tuple(rows.shape[1:])
    if group.size == 1:
        return mine, rows.index_select(0, mine.to(rows.device)).unsqueeze(0)
    send = rows.index_select(0, order.to(rows.device)).contiguous()
    m = int(mine.numel())
    recv = rows.new_empty((group.size * m,) + tail)
    dist.all_to_all_single(recv, send, [m] * group.size, counts, group=group.device_group)
    return mine, recv.view((group.size, m) + tail)
