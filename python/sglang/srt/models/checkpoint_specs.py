"""A model's checkpoint layout, derived from the model itself.

`derive_weight_specs(model_cls, config, stacked)` lists the HF checkpoint tensors (name, FULL
unsharded shape) that `model_cls.load_weights` takes for `config`. It builds the model once on the
"meta" device (no memory, no values) with single-rank groups, so it has every layer and every
parameter whole, and maps each parameter back to the checkpoint tensors it is loaded from:

- a parameter whose name holds a fused piece of the model's stacked-params table (`qkv_proj`,
  `gate_up_proj`: the table `load_weights` uses) -> one tensor per table entry, the checkpoint
  piece in its name, the shape its layer gives for that shard id (`checkpoint_shape`);
- the fused routed-expert weights of a `FusedMoE` -> its per-expert `gate/up/down_proj` tensors
  (`FusedMoE.checkpoint_tensors`);
- everything else 1:1 (name and shape of the parameter).

A tied LM head shares the embedding's parameter and `named_parameters` lists it once, as the
embedding: the tied head is therefore not listed, as in an HF checkpoint.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Union

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear
from sglang.srt.layers.moe.experts import FusedMoE

WeightSpec = tuple[str, tuple[int, ...]]
# checkpoint name piece -> (fused parameter piece, shard id), e.g. (".q_proj.", ".qkv_proj.", "q")
StackedParam = tuple[str, str, Union[int, str]]
ModelFactory = Callable[[Any, ParallelGroups, torch.dtype], nn.Module]


def checkpoint_specs(model: nn.Module, stacked: Sequence[StackedParam]) -> list[WeightSpec]:
    """Checkpoint tensors (HF name, shape) that fill `model`'s parameters, in parameter order.

    Shapes are the parameters' own except where a layer gives them (fused projections, experts):
    build `model` with single-rank groups for full (unsharded) shapes."""
    modules = dict(model.named_modules())
    specs: list[WeightSpec] = []
    for name, param in model.named_parameters():
        owner_name, _, attr = name.rpartition(".")
        owner = modules[owner_name]
        if isinstance(owner, FusedMoE):
            specs += [(f"{owner_name}.{sub}", shape) for sub, shape in owner.checkpoint_tensors(attr)]
            continue
        parts = [(name.replace(fused, piece), shard) for piece, fused, shard in stacked if fused in name]
        if not parts:
            specs.append((name, tuple(param.shape)))
            continue
        if not isinstance(owner, (MergedColumnParallelLinear, QKVParallelLinear)):
            raise TypeError(
                f"{name}: a stacked-params entry names it, but {type(owner).__name__} is not a fused layer"
            )
        specs += [(ckpt_name, owner.checkpoint_shape(shard, param)) for ckpt_name, shard in parts]
    return specs


def derive_weight_specs(
    model_cls: ModelFactory, config: Any, stacked: Sequence[StackedParam]
) -> list[WeightSpec]:
    """Checkpoint tensors (HF name, FULL shape) of `model_cls(config, ...)`: every layer, tp size 1."""
    with torch.device("meta"):
        model = model_cls(config, ParallelGroups.single(), torch.float32)
    return checkpoint_specs(model, stacked)
