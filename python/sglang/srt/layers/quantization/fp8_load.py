"""Load an FP8 block-quantized checkpoint: which linears stay FP8 (`Fp8CheckpointStream`, the
shared `checkpoint_stream.QuantCheckpointStream` with DeepSeek's `weight_scale_inv`; routed experts
FP8 too where their blocks fit, `fp8_moe.py`; fused QKV projections are widened at load), and the refusal of block scales in an unquantized checkpoint.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from sglang.srt.layers.linear import LinearBase, QKVParallelLinear
from sglang.srt.layers.quantization.checkpoint_stream import QuantCheckpointStream
from sglang.srt.layers.quantization.config import QuantSpec
from sglang.srt.layers.quantization.fp8_block import (
    FP8_DTYPE,
    Fp8BlockLinearMethod,
    block_dequant,
    is_power_of_two,
)
from sglang.srt.layers.quantization.fp8_moe import Fp8BlockMoEMethod

SCALE_SUFFIX = "_scale_inv"  # "<module>.weight_scale_inv" beside "<module>.weight"


class Fp8CheckpointStream(QuantCheckpointStream):
    """Wraps a checkpoint's (name, tensor) stream for `model` (FP8 linears made as they come)."""

    label = "FP8"
    quant_dtype = FP8_DTYPE
    scale_suffix = SCALE_SUFFIX

    def __init__(
        self,
        model: nn.Module,
        spec: QuantSpec,
        stacked: Sequence,
        in_stage: Callable[[int], bool],
        params: dict[str, nn.Parameter],
    ):
        self.method = Fp8BlockLinearMethod(spec.weight_block_size)
        self.scale_fmt = spec.scale_fmt
        self.moe_method = Fp8BlockMoEMethod(spec.weight_block_size)
        super().__init__(model, stacked, in_stage, params)

    def serves(self, layer: LinearBase) -> bool:
        return not isinstance(layer, QKVParallelLinear)

    def dequant(self, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return block_dequant(weight, scale, self.method.block)

    def check_scale(self, name: str, scale: torch.Tensor) -> None:
        """`scale_fmt: ue8m0`: every block scale must be a power of two (the format stores only an
        exponent; a checkpoint that says so but carries other scales is refused, not served)."""
        if self.scale_fmt == "ue8m0" and not is_power_of_two(scale):
            raise ValueError(
                f"{name}: quantization_config says scale_fmt ue8m0, but this scale has values that are "
                "not powers of two"
            )


def refuse_scales(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint without quantization_config must not carry FP8 block scales, int8 channel
    scales or int8 weights."""
    for name, tensor in weights:
        if name.endswith(".weight" + SCALE_SUFFIX):
            what = "an FP8 block scale"
        elif name.endswith(".weight_scale"):
            what = "an int8 channel scale"
        elif tensor.dtype == torch.int8:
            what = "an int8 tensor"
        else:
            yield name, tensor
            continue
        raise ValueError(f"{name}: {what} in a checkpoint whose config.json has no quantization_config")
