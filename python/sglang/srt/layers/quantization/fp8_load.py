"""Load an FP8 block-quantized checkpoint: which linears stay FP8, and the checkpoint stream.

`Fp8CheckpointStream` wraps the (name, tensor) stream of a checkpoint. The first FP8 weight or
`weight_scale_inv` of a linear layer turns that layer to FP8 (`Fp8BlockLinearMethod`, before any
of its tensors loads), and its weights and scales pass through unchanged. Layers not built for FP8
get their weight dequantized once, at load (weight and scale paired as they arrive), and hold a
widened copy: the modules the model reads as plain tensors (`model.fp8_unquantized_modules`, e.g.
DeepSeek's kv_b_proj, absorbed into the attention), routed experts and fused QKV projections.
Tensors of layers outside this pipeline stage pass through untouched (the loader skips them).
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from sglang.srt.layers.linear import LinearBase, QKVParallelLinear
from sglang.srt.layers.quantization.config import QuantSpec
from sglang.srt.layers.quantization.fp8_block import FP8_DTYPE, Fp8BlockLinearMethod, block_dequant

SCALE_SUFFIX = "_scale_inv"  # "<module>.weight_scale_inv" beside "<module>.weight"
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


def _module_of(weight_name: str, stacked: Sequence[tuple[str, str, object]]) -> str:
    """The model module a checkpoint `<module>.weight` goes to (fused pieces renamed)."""
    module = weight_name.rsplit(".", 1)[0] + "."
    for ckpt_piece, fused_piece, _ in stacked:
        if ckpt_piece in module:
            return module.replace(ckpt_piece, fused_piece)[:-1]
    return module[:-1]


class Fp8CheckpointStream:
    """Wraps a checkpoint's (name, tensor) stream for `model` (FP8 linears made as they come)."""

    def __init__(
        self,
        model: nn.Module,
        spec: QuantSpec,
        stacked: Sequence,
        in_stage: Callable[[int], bool],
        params: dict[str, nn.Parameter],
    ):
        """`params`: the loader's name -> parameter table, updated as layers are made FP8."""
        skip = set(getattr(model, "fp8_unquantized_modules", ()))
        self.linears = {
            name: m
            for name, m in model.named_modules()
            if isinstance(m, LinearBase)
            and not isinstance(m, QKVParallelLinear)
            and name.rsplit(".", 1)[-1] not in skip
        }
        self.method = Fp8BlockLinearMethod(spec.weight_block_size)
        self.stacked = stacked
        self.in_stage = in_stage
        self.params = params
        self.held: set[str] = set()  # module names made FP8
        self._pending: dict[str, dict[str, torch.Tensor]] = {}

    def __call__(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            is_scale = name.endswith(".weight" + SCALE_SUFFIX)
            m = _LAYER_RE.match(name)
            if (m and not self.in_stage(int(m.group(1)))) or not (is_scale or tensor.dtype == FP8_DTYPE):
                self._check_float(name)
                yield name, tensor
                continue
            weight_name = name[: -len(SCALE_SUFFIX)] if is_scale else name
            module = _module_of(weight_name, self.stacked)
            if module in self.linears:
                if module not in self.held:
                    self._make_fp8(module)
                yield name, tensor
                continue
            parts = self._pending.setdefault(weight_name, {})
            parts["scale" if is_scale else "weight"] = tensor
            if len(parts) == 2:  # widened once; the parameter's copy casts it to the model dtype
                del self._pending[weight_name]
                yield weight_name, block_dequant(parts["weight"], parts["scale"], self.method.block)
        if self._pending:
            raise ValueError(
                f"FP8 weights without their scale (or scales without a weight): {sorted(self._pending)[:4]}"
            )

    def _make_fp8(self, module: str) -> None:
        layer = self.linears[module]
        self.method.create_weights(layer, module)
        self.params[module + ".weight"] = layer.weight
        self.params[module + ".weight" + SCALE_SUFFIX] = layer.weight_scale_inv
        self.held.add(module)

    def _check_float(self, name: str) -> None:
        """A float weight for a layer already made FP8 (the checkpoint mixes formats in one layer)."""
        if name.endswith(".weight") and _module_of(name, self.stacked) in self.held:
            raise ValueError(f"{name}: a float weight for a layer whose other checkpoint pieces are FP8")


def refuse_scales(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint without quantization_config must not carry FP8 block scales."""
    for name, tensor in weights:
        if name.endswith(".weight" + SCALE_SUFFIX):
            raise ValueError(
                f"{name}: an FP8 block scale in a checkpoint whose config.json has no quantization_config"
            )
        yield name, tensor
