"""`CPRuntime`: what a model runner keeps for context parallelism (the cp group, the split
strategy, the slot mapping, the per-batch layout options and this rank's counters), and how it
attaches each batch's `CPLayout` (layers/context_parallel.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from sglang.srt import envs
from sglang.srt.layers.context_parallel import (
    CP_STRATEGIES,
    CPBatch,
    CPLayout,
    CPStats,
    build_cp_layout_for_batch,
)
from sglang.srt.mem_cache.cp_slots import CPSlotMapping

if TYPE_CHECKING:
    from sglang.srt.distributed.group_coordinator import GroupCoordinator


# `--cp-kv-gather-segment` when not given. MLA / DSA: 0 (one gather). A round's partial result per
# own query ([heads, latent] float32, merged by LSE) and DSA's running top-k candidates ([index_topk]
# scores and positions per query) outweigh the latent rows a round saves until the prefix is
# ~100x the chunk's own queries: on the V3.2 dummy at 128K (chunk 16K, cp 2 x pp 2) 16K-row
# rounds took 1.5x the peak memory and 1.8x the time of one gather (docs/context_parallel.md).
SEGMENT_BY_KIND = {"mha": 16384, "mla": 0}


@dataclass(frozen=True)
class CPRuntime:
    """What a model runner needs for CP: the cp group, the split strategy and the slot mapping;
    whether decodes are dealt over the ranks (`split_decodes`, else replicated: the old path),
    this rank's work counters, the prompt length below which a prefill is not split
    (`min_split_tokens`), the cap on cached-prefix rows gathered per round (`kv_gather_segment`)
    and an optional `CPProbe`; the last two are copied onto every layout."""

    group: "GroupCoordinator"
    strategy: str
    mapping: CPSlotMapping
    split_decodes: bool = True
    stats: CPStats = field(default_factory=CPStats)
    kv_gather_segment: int = 0  # --cp-kv-gather-segment
    min_split_tokens: int = 0  # --cp-min-split-tokens (resolved: the platform's when not given)
    probe: Optional[Any] = None  # a CPProbe attached to every layout (tests, benchmarks)

    @staticmethod
    def from_server_args(
        server_args: Any, group: "GroupCoordinator", platform: Any = None, attention_kind: str = "mha"
    ) -> Optional["CPRuntime"]:
        """None when the cp group has one rank. `--cp-min-split-tokens` when given, else
        `SGLANG_CP_MIN_SPLIT_TOKENS`, else the platform's `cp_min_split_tokens` (None: 0).
        `--cp-kv-gather-segment` when given, else by the model's `attention_kind` (`SEGMENT_BY_KIND`)."""
        if group.size == 1:
            return None
        strategy = getattr(server_args, "cp_strategy", "zigzag")
        if strategy not in CP_STRATEGIES:
            raise ValueError(f"--cp-strategy must be one of {list(CP_STRATEGIES)}, got {strategy!r}")
        interleave = int(getattr(server_args, "cp_kv_cache_interleave_size", 1) or 1)
        segment = getattr(server_args, "cp_kv_gather_segment", None)
        if segment is None:
            segment = SEGMENT_BY_KIND.get(attention_kind, SEGMENT_BY_KIND["mha"])
        if segment < 0:
            raise ValueError(f"--cp-kv-gather-segment must be >= 0 (0: no cap), got {segment}")
        min_split = getattr(server_args, "cp_min_split_tokens", None)
        if min_split is None:
            min_split = envs.SGLANG_CP_MIN_SPLIT_TOKENS.get()
        if min_split is None:
            min_split = getattr(platform, "cp_min_split_tokens", 0)
        if min_split < 0:
            raise ValueError(f"--cp-min-split-tokens must be >= 0 (0: always split), got {min_split}")
        mapping = CPSlotMapping(server_args.page_size, group.size, interleave)
        return CPRuntime(group, strategy, mapping, kv_gather_segment=segment, min_split_tokens=int(min_split))

    def attach(self, forward_batch: CPBatch) -> CPLayout:
        """Compute this rank's layout of the batch and attach it (before the backend's metadata)."""
        layout = build_cp_layout_for_batch(
            forward_batch,
            self.group,
            self.strategy,
            self.mapping,
            self.split_decodes,
            self.stats,
            self.min_split_tokens,
        )
        assert layout is not None
        layout.kv_gather_segment, layout.probe = self.kv_gather_segment, self.probe
        return layout
