"""The checkpoint stream that loads a quantized checkpoint of a given `QuantSpec` (the one entry
`models/weight_loading.py` calls), or the refusal of quantized tensors in an unquantized one."""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional, Sequence

import torch
from torch import nn

from sglang.srt.layers.quantization.config import W8A8_INT8, QuantSpec
from sglang.srt.layers.quantization.fp8_load import Fp8CheckpointStream, refuse_scales
from sglang.srt.layers.quantization.w8a8_load import Int8CheckpointStream


def quantized_weights(
    model: nn.Module,
    spec: Optional[QuantSpec],
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked: Sequence,
    in_stage: Callable[[int], bool],
    params: dict[str, nn.Parameter],
) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` as the loader should see them: quantized linears made as their tensors come
    (`params` updated), other quantized tensors widened; scales refused where `spec` is None."""
    if spec is None:
        return refuse_scales(weights)
    if spec.method == W8A8_INT8:
        return Int8CheckpointStream(model, stacked, in_stage, params)(weights)
    return Fp8CheckpointStream(model, spec, stacked, in_stage, params)(weights)
