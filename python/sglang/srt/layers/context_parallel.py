"""Context parallelism (CP): how a batch's tokens are laid out over the ranks of one CP group.

Token split (prefill CP). The new tokens of every request with more than one new token (a
prefill or a prefill chunk) are divided among the cp ranks:
- zigzag: the request's tokens are cut into 2·cp segments (the first n mod 2cp segments one token
  longer); rank r takes segments r and 2cp−1−r, so causal-attention work is balanced;
- round-robin: token j of the request goes to rank j mod cp.
Requests with one new token (decodes) are either *split* (`split_decodes`, what the runtime
uses): the decodes are dealt round-robin, the j-th decode of the batch to rank j mod cp, so each
rank runs the dense layers, MoE and LM head of its share only, while the attention of every decode
still covers every rank's KV shard (queries gathered, partials sent back to the holder and merged
there); or *replicated* (the old path, kept for comparison): every cp rank holds them. Every rank
keeps its tokens of each request contiguous, in request order and ascending position, so the
local token list of a rank is a subsequence of the batch's flat token list (`local_idx`).

`CPLayout.build` computes the layout of every rank from the batch's CPU lists (identical on all
ranks), including who holds each split token, so that any set of tokens can be gathered back
into the original order (`GatherSpec` + `start_gather`): K/V per layer, queries of chunked
prefills, and the final hidden states before the LM head.

`CPLayout` is attached to a `ForwardBatch` (`forward_batch.cp_layout`) with `set_cp_layout` and
read with `get_cp_layout`. Per batch it also keeps the gather specs it derives (typed fields, built
on first use) and the exchanges in flight (`pending`: layer id -> `PendingGather`, e.g. a layer's
K/V all-gather started by the attention backend's early-exchange hook).

This module does not import `model_executor`: the batch is seen through the `CPBatch` protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence

import torch

from sglang.srt.layers.cp_exchange import GatherSpec, PendingGather, start_gather
from sglang.srt.mem_cache.cp_slots import CPSlotMapping

if TYPE_CHECKING:
    from sglang.srt.distributed.group_coordinator import GroupCoordinator

CP_STRATEGIES = ("zigzag", "round-robin")

# Request kinds inside a CP batch.
FRESH = 0  # multi-token extend without cached prefix: split; local queries vs gathered full K/V
PREFIX = 1  # multi-token extend over a cached prefix: split; partial attention per KV shard + merge
REPLICATED = 2  # one new token (decode): partial attention per KV shard + merge (see `split_decodes`)
DECODE = REPLICATED


# ---------------------------------------------------------------------------- pure token split
def zigzag_segment_sizes(num_tokens: int, cp_size: int) -> list[int]:
    """Sizes of the 2·cp zigzag segments (the first `num_tokens mod 2cp` get one extra token)."""
    segments = 2 * cp_size
    base, extra = divmod(num_tokens, segments)
    return [base + 1 if i < extra else base for i in range(segments)]


def split_offsets(num_tokens: int, cp_size: int, strategy: str) -> list[torch.Tensor]:
    """Per rank, the (ascending) offsets within a request of the tokens that rank holds."""
    if strategy not in CP_STRATEGIES:
        raise ValueError(f"unknown cp strategy {strategy!r}; expected one of {list(CP_STRATEGIES)}")
    if cp_size == 1:
        return [torch.arange(num_tokens, dtype=torch.int64)]
    if strategy == "round-robin":
        return [torch.arange(r, max(r, num_tokens), cp_size, dtype=torch.int64) for r in range(cp_size)]
    sizes = zigzag_segment_sizes(num_tokens, cp_size)
    starts = [0]
    for s in sizes:
        starts.append(starts[-1] + s)
    segs = [torch.arange(starts[i], starts[i + 1], dtype=torch.int64) for i in range(2 * cp_size)]
    return [torch.cat([segs[r], segs[2 * cp_size - 1 - r]]) for r in range(cp_size)]


def restore_order(shards: Sequence[torch.Tensor], num_tokens: int, strategy: str) -> torch.Tensor:
    """Inverse of `split_offsets` for one request: cat(shards) re-indexed into original order."""
    cp = len(shards)
    offs = torch.cat(split_offsets(num_tokens, cp, strategy))
    out = torch.empty_like(torch.cat(list(shards)))
    out[offs] = torch.cat(list(shards))
    return out


# ---------------------------------------------------------------------------- batch layout
@dataclass
class CPStats:
    """Per-rank counters of the work a CP rank did (kept by `CPRuntime`, added to by the layout's
    users): decode tokens run through the model, rows given to the LM head, and partial-attention
    rows merged (summed over layers), and prefill tokens run whole on every rank (a FRESH request
    shorter than `min_split_tokens`, not split)."""

    decode_rows: int = 0
    logit_rows: int = 0
    merged_rows: int = 0
    unsplit_prefill_tokens: int = 0


@dataclass
class CPLayout:
    """Token layout of one batch over the cp ranks, seen from rank `cp_rank`."""

    cp_size: int
    cp_rank: int
    strategy: str
    num_tokens: int  # tokens of the whole batch (global, flat)
    kinds: list[int]  # per request: FRESH / PREFIX / REPLICATED
    starts: list[int]  # per request: first global flat index
    ext_lens: list[int]
    prefix_lens: list[int]
    local_idx: torch.Tensor  # [num_local] global flat index of each local token
    local_starts: list[int]  # per request: first local row (its local rows are contiguous)
    local_counts: list[int]  # per request: local rows
    local_offsets: list[torch.Tensor]  # per request: offsets (within the request) of its local tokens
    holder_rank: torch.Tensor  # [num_tokens] rank holding a split token, -1 for replicated tokens
    holder_row: torch.Tensor  # [num_tokens] that rank's local row (for replicated: this rank's row)
    group: Optional["GroupCoordinator"] = None
    slot_mapping: Optional[CPSlotMapping] = None
    split_decodes: bool = False  # decodes dealt to one rank each (else replicated on every rank)
    min_split_tokens: int = 0  # FRESH requests with fewer new tokens run whole on every rank
    stats: Optional["CPStats"] = field(default=None, repr=False)
    # Derived per batch, built on first use (see the *_spec methods).
    _split_spec: Optional[GatherSpec] = field(default=None, repr=False)
    _last_tokens_spec: Optional[GatherSpec] = field(default=None, repr=False)
    _last_idx: Optional[torch.Tensor] = field(default=None, repr=False)
    _replicated_last: Optional[tuple[torch.Tensor, torch.Tensor]] = field(default=None, repr=False)
    _trivial: Optional[bool] = field(default=None, repr=False)
    # Exchanges in flight: layer id -> its all-gather (started early, waited on by the layer).
    pending: dict[int, PendingGather] = field(default_factory=dict, repr=False)
    kv_gather_segment: int = 0  # cap on cached-prefix rows gathered per round (0: no cap)
    probe: Optional[Any] = None  # counters / trace of the gathers (`attention/cp_probe.py`; None: off)

    # ------------------------------------------------------------------ construction
    @staticmethod
    def build(
        ext_lens: Sequence[int],
        prefix_lens: Sequence[int],
        cp_size: int,
        cp_rank: int,
        strategy: str = "zigzag",
        group: Optional["GroupCoordinator"] = None,
        slot_mapping: Optional[CPSlotMapping] = None,
        split_decodes: bool = False,
        stats: Optional["CPStats"] = None,
        min_split_tokens: int = 0,
    ) -> "CPLayout":
        """`split_decodes`: deal the decodes over the ranks (False: replicate them on every rank).
        `min_split_tokens`: a FRESH request (no cached prefix) with fewer new tokens is not split:
        every rank runs all of it, its attention is local and it adds nothing to the exchanges
        (CP only where it pays; a PREFIX request is always split, its prefix being sharded)."""
        if not 0 <= cp_rank < cp_size:
            raise ValueError(f"cp_rank {cp_rank} out of range for cp_size {cp_size}")
        n_total = int(sum(ext_lens))
        if n_total == len(ext_lens):  # decodes only
            split = split_decodes and cp_size > 1
            layout = CPLayout._decodes_only(prefix_lens, cp_size, cp_rank, strategy, split)
        else:
            layout = CPLayout._mixed(
                ext_lens, prefix_lens, cp_size, cp_rank, strategy, split_decodes, min_split_tokens
            )
        layout.group, layout.slot_mapping = group, slot_mapping
        layout.split_decodes, layout.stats = split_decodes, stats
        layout.min_split_tokens = min_split_tokens
        if min_split_tokens > 0 and cp_size > 1 and stats is not None:  # 0: every prompt is split
            unsplit = sum(
                n for k, n in zip(layout.kinds, layout.ext_lens) if k == FRESH and n < min_split_tokens
            )
            layout.count("unsplit_prefill_tokens", unsplit)
        return layout

    @staticmethod
    def _mixed(
        ext_lens, prefix_lens, cp_size, cp_rank, strategy, split_decodes, min_split_tokens=0
    ) -> "CPLayout":
        """The layout of a batch with at least one multi-token request."""
        n_total = int(sum(ext_lens))
        holder_rank = torch.full((n_total,), -1, dtype=torch.int64)
        holder_row = torch.zeros(n_total, dtype=torch.int64)
        kinds, starts, offsets_mine = [], [], []
        local_counts = [[0] * len(ext_lens) for _ in range(cp_size)]
        next_row = [0] * cp_size
        start = decodes = 0
        for i, (n, pre) in enumerate(zip(ext_lens, prefix_lens)):
            n, pre = int(n), int(pre)
            kind = REPLICATED if n == 1 else (FRESH if pre == 0 else PREFIX)
            kinds.append(kind)
            starts.append(start)
            split = cp_size > 1 and (
                split_decodes if kind == REPLICATED else kind == PREFIX or n >= min_split_tokens
            )
            if not split:
                offs = [torch.arange(n, dtype=torch.int64)] * cp_size
            elif kind == REPLICATED:  # a split decode: the j-th decode on rank j mod cp
                offs = [torch.arange(int(r == decodes % cp_size), dtype=torch.int64) for r in range(cp_size)]
                decodes += 1
            else:
                offs = split_offsets(n, cp_size, strategy)
            for r in range(cp_size):
                k = int(offs[r].numel())
                if split:
                    holder_rank[start + offs[r]] = r
                    holder_row[start + offs[r]] = torch.arange(next_row[r], next_row[r] + k)
                elif r == cp_rank:
                    holder_row[start : start + n] = torch.arange(next_row[r], next_row[r] + n)
                local_counts[r][i] = k
                next_row[r] += k
            offsets_mine.append(offs[cp_rank])
            start += n
        counts = local_counts[cp_rank]
        local_starts, row = [], 0
        for k in counts:
            local_starts.append(row)
            row += k
        parts = [s + o for s, o in zip(starts, offsets_mine)]
        local_idx = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
        return CPLayout(
            cp_size,
            cp_rank,
            strategy,
            n_total,
            kinds,
            starts,
            [int(x) for x in ext_lens],
            [int(x) for x in prefix_lens],
            local_idx,
            local_starts,
            counts,
            offsets_mine,
            holder_rank,
            holder_row,
        )

    @staticmethod
    def _decodes_only(prefix_lens, cp_size, cp_rank, strategy, split: bool) -> "CPLayout":
        """The layout of a batch of decode tokens: dealt round-robin when `split` (decode j on rank
        j mod cp), else each one replicated on every rank."""
        b = len(prefix_lens)
        idx = torch.arange(b, dtype=torch.int64)
        if split:
            counts = [int(i % cp_size == cp_rank) for i in range(b)]
            local_starts = [(i - cp_rank + cp_size - 1) // cp_size if i > cp_rank else 0 for i in range(b)]
            local_idx, holder_rank, holder_row = idx[cp_rank::cp_size], idx % cp_size, idx // cp_size
        else:
            counts, local_starts = [1] * b, list(range(b))
            local_idx, holder_rank, holder_row = idx, torch.full((b,), -1, dtype=torch.int64), idx.clone()
        one, none = torch.zeros(1, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
        return CPLayout(
            cp_size,
            cp_rank,
            strategy,
            b,
            [REPLICATED] * b,
            list(range(b)),
            [1] * b,
            [int(x) for x in prefix_lens],
            local_idx,
            local_starts,
            counts,
            [one if c else none for c in counts],
            holder_rank,
            holder_row,
        )

    # ------------------------------------------------------------------ queries
    @property
    def batch_size(self) -> int:
        return len(self.kinds)

    @property
    def num_local(self) -> int:
        return int(self.local_idx.numel())

    @property
    def is_trivial(self) -> bool:
        """Every rank holds every token (cp 1, or a batch without a split token: replicated decodes
        and prefills below `min_split_tokens`): no K/V or row exchange is needed."""
        if self.cp_size == 1:
            return True
        if self._trivial is None:
            self._trivial = not bool((self.holder_rank >= 0).any())
        return self._trivial

    def count(self, name: str, rows: int) -> None:
        """Add `rows` to this rank's counter `name` (`CPStats`), when the runtime keeps them."""
        if self.stats is not None:
            setattr(self.stats, name, getattr(self.stats, name) + int(rows))

    def num_local_decodes(self) -> int:
        """Decode tokens this rank runs through the model (all of them when replicated)."""
        return sum(c for k, c in zip(self.kinds, self.local_counts) if k == REPLICATED)

    def token_kinds(self) -> torch.Tensor:
        """[num_tokens] the kind of each token's request."""
        return torch.repeat_interleave(
            torch.tensor(self.kinds, dtype=torch.int64), torch.tensor(self.ext_lens, dtype=torch.int64)
        )

    def gather_spec(self, global_idx: torch.Tensor) -> GatherSpec:
        """Spec gathering the SPLIT tokens among `global_idx` (replicated ones are local everywhere)."""
        global_idx = global_idx.to(torch.int64)
        ranks = self.holder_rank[global_idx]
        sizes, per_rank, mine = [], [], None
        for r in range(self.cp_size):
            sel = global_idx[ranks == r]
            sizes.append(int(sel.numel()))
            per_rank.append(sel)
            if r == self.cp_rank:
                mine = self.holder_row[sel]
        if mine is None:
            mine = torch.empty(0, dtype=torch.int64)
        return GatherSpec(sizes, mine, torch.cat(per_rank) if per_rank else mine)

    def split_spec(self) -> GatherSpec:
        """All split tokens of the batch (for K/V and full hidden-state gathers)."""
        if self._split_spec is None:
            self._split_spec = self.gather_spec(torch.nonzero(self.holder_rank >= 0).flatten())
        return self._split_spec

    def last_tokens_spec(self) -> GatherSpec:
        """Each request's last new token (the hidden states the LM head needs)."""
        if self._last_tokens_spec is None:
            self._last_tokens_spec = self.gather_spec(self.last_token_idx())
        return self._last_tokens_spec

    # ------------------------------------------------------------------ data movement
    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """Global-layout rows -> this rank's local rows."""
        if self.cp_size == 1:
            return x
        return x.index_select(0, self.local_idx.to(x.device))

    def gather_rows(
        self, x_local: torch.Tensor, global_idx: torch.Tensor, spec: Optional[GatherSpec] = None
    ) -> torch.Tensor:
        """Rows `global_idx` (in that order) of the global layout, assembled from local rows."""
        if self.is_trivial:
            return x_local.index_select(0, self.holder_row[global_idx].to(x_local.device))
        spec = spec or self.gather_spec(global_idx)
        dev = x_local.device
        gathered = start_gather(
            self.group, x_local.index_select(0, spec.local_rows.to(dev)), spec.sizes
        ).wait()
        out = x_local.new_empty((int(global_idx.numel()),) + tuple(x_local.shape[1:]))
        # position of each requested row: split rows come from the gather, replicated from local
        pos = torch.full((self.num_tokens,), -1, dtype=torch.int64)
        pos[global_idx] = torch.arange(global_idx.numel())
        split = self.holder_rank[global_idx] >= 0
        if spec.total:
            out.index_copy_(0, pos[spec.global_idx].to(dev), gathered)
        repl = torch.nonzero(~split).flatten()
        if repl.numel():
            out.index_copy_(
                0, repl.to(dev), x_local.index_select(0, self.holder_row[global_idx[repl]].to(dev))
            )
        return out

    def gather_all(self, x_local: torch.Tensor) -> torch.Tensor:
        """The whole batch in original order."""
        if self.cp_size == 1:
            return x_local
        return self.gather_rows(x_local, torch.arange(self.num_tokens), self.split_spec())

    def last_token_idx(self) -> torch.Tensor:
        """[batch_size] global flat index of each request's last new token (built once per batch)."""
        if self._last_idx is None:
            self._last_idx = torch.tensor(
                [s + n - 1 for s, n in zip(self.starts, self.ext_lens)], dtype=torch.int64
            )
        return self._last_idx

    def replicated_last_tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(request index, local row) of each request whose last token every rank holds (an
        unsplit prefill, or a replicated decode), ascending request order; built once per batch
        (the model exit and the logit assembly both read it)."""
        if self._replicated_last is None:
            last = self.last_token_idx()
            reqs = torch.nonzero(self.holder_rank[last] < 0).flatten()
            self._replicated_last = (reqs, self.holder_row[last[reqs]])
        return self._replicated_last


# ---------------------------------------------------------------------------- forward batch glue
class CPBatch(Protocol):
    """What this module reads and writes on a `ForwardBatch`."""

    cp_layout: Optional[CPLayout]
    extend_seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int]


def set_cp_layout(forward_batch: CPBatch, layout: Optional[CPLayout]) -> None:
    forward_batch.cp_layout = layout


def is_cp_batch(forward_batch: CPBatch) -> bool:
    """True when the batch runs context-parallel (cp > 1)."""
    return get_cp_layout(forward_batch) is not None


def get_cp_layout(forward_batch: CPBatch) -> Optional[CPLayout]:
    """The batch's CP layout, or None when the batch is not context-parallel (cp 1)."""
    layout = forward_batch.cp_layout
    if layout is None or layout.cp_size == 1:
        return None
    return layout


def build_cp_layout_for_batch(
    forward_batch: CPBatch,
    group: "GroupCoordinator",
    strategy: str,
    slot_mapping: CPSlotMapping,
    split_decodes: bool = True,
    stats: Optional[CPStats] = None,
    min_split_tokens: int = 0,
) -> Optional[CPLayout]:
    """Compute and attach the CP layout of `forward_batch` for this rank of `group` (cp > 1);
    `split_decodes=False` replicates the decodes on every rank (the old path); FRESH requests
    below `min_split_tokens` new tokens run whole on every rank."""
    if group.size == 1:
        return None
    layout = CPLayout.build(
        forward_batch.extend_seq_lens_cpu,
        forward_batch.extend_prefix_lens_cpu,
        group.size,
        group.rank,
        strategy,
        group=group,
        slot_mapping=slot_mapping,
        split_decodes=split_decodes,
        stats=stats,
        min_split_tokens=min_split_tokens,
    )
    set_cp_layout(forward_batch, layout)
    return layout
