"""Pipeline-stage layer ranges (`pp_partition`, `pp_layer_range`), the global-id layer list
(`make_layers`) and the placeholder for modules of other stages (`PPMissingLayer`)."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from torch import nn

from sglang.srt import envs


class PPMissingLayer(nn.Identity):
    """Stands in for a layer (or embedding / head) that lives on another pipeline stage."""


def pp_partition(num_layers: int, pp_size: int, partition: Optional[Sequence[int]] = None) -> list[int]:
    """Decoder layers of each pipeline stage.

    `partition` (default: `SGLANG_PP_LAYER_PARTITION`, ignored when pp_size is 1) must have
    `pp_size` entries, each >= 1, summing to `num_layers`. Without one the split is even and the
    remainder goes to the LAST stages (e.g. 30 layers over 4 stages: 7, 7, 8, 8), because the
    first stage also runs the embedding and the scheduler. Raises ValueError with a readable
    sentence otherwise."""
    if pp_size < 1:
        raise ValueError(f"pp_size must be >= 1, got {pp_size}")
    if num_layers < pp_size:
        raise ValueError(
            f"--pp-size {pp_size} is larger than the model's number of layers ({num_layers}): "
            "every pipeline stage needs at least one layer"
        )
    if partition is None and pp_size > 1:
        partition = envs.SGLANG_PP_LAYER_PARTITION.get()
    if partition is None or pp_size == 1:
        base, extra = divmod(num_layers, pp_size)
        return [base + (1 if rank >= pp_size - extra else 0) for rank in range(pp_size)]
    parts = [int(p) for p in partition]
    where = f"SGLANG_PP_LAYER_PARTITION={','.join(str(p) for p in parts)}"
    if len(parts) != pp_size:
        raise ValueError(
            f"{where} has {len(parts)} entries but --pp-size is {pp_size}: give one entry per stage"
        )
    if any(p < 1 for p in parts):
        raise ValueError(f"{where}: every stage needs at least one layer")
    if sum(parts) != num_layers:
        raise ValueError(f"{where} sums to {sum(parts)} but the model has {num_layers} layers")
    return parts


def pp_layer_range(
    num_layers: int, pp_rank: int, pp_size: int, partition: Optional[Sequence[int]] = None
) -> tuple[int, int]:
    """[start, end) of the global layer ids owned by `pp_rank` (see `pp_partition`)."""
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank {pp_rank} out of range [0, {pp_size})")
    parts = pp_partition(num_layers, pp_size, partition)
    start = sum(parts[:pp_rank])
    return start, start + parts[pp_rank]


def make_layers(
    num_layers: int, layer_fn: Callable[[int], nn.Module], start: int = 0, end: int | None = None
) -> nn.ModuleList:
    """ModuleList indexed by GLOBAL layer id: `layer_fn(i)` for i in [start, end), placeholders elsewhere."""
    end = num_layers if end is None else end
    if not 0 <= start <= end <= num_layers:
        raise ValueError(f"layer range [{start}, {end}) not within [0, {num_layers}]")
    return nn.ModuleList([layer_fn(i) if start <= i < end else PPMissingLayer() for i in range(num_layers)])
