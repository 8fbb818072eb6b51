"""Helpers shared by model definitions: pipeline-stage layer ranges and placeholder layers."""

from __future__ import annotations

from typing import Callable

from torch import nn


class PPMissingLayer(nn.Identity):
    """Stands in for a layer (or embedding / head) that lives on another pipeline stage."""


def pp_layer_range(num_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """[start, end) of the layers owned by `pp_rank`: an even split, earlier stages take the remainder."""
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank {pp_rank} out of range [0, {pp_size})")
    if num_layers < pp_size:
        raise ValueError(f"num_layers ({num_layers}) must be >= pp size ({pp_size})")
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return start, start + base + (1 if pp_rank < extra else 0)


def make_layers(
    num_layers: int, layer_fn: Callable[[int], nn.Module], start: int = 0, end: int | None = None
) -> nn.ModuleList:
    """ModuleList indexed by GLOBAL layer id: `layer_fn(i)` for i in [start, end), placeholders elsewhere."""
    end = num_layers if end is None else end
    if not 0 <= start <= end <= num_layers:
        raise ValueError(f"layer range [{start}, {end}) not within [0, {num_layers}]")
    return nn.ModuleList([layer_fn(i) if start <= i < end else PPMissingLayer() for i in range(num_layers)])
