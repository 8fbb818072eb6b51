"""Load an FP8 block-quantized checkpoint: which linears stay FP8, and the checkpoint stream.

`prepare_fp8_model` turns to FP8 (`Fp8BlockLinearMethod`) every linear layer of the model whose
checkpoint weight has a `weight_scale_inv` beside it, except the modules the model reads as plain
tensors (`model.fp8_unquantized_modules`, e.g. DeepSeek's kv_b_proj, absorbed into the attention)
and the layers not built for FP8 yet (routed experts, fused QKV). `Fp8CheckpointStream` then
passes those layers' FP8 weights and scales through unchanged, and dequantizes the weight of every
other quantized tensor once, at load, to the model dtype (so those layers hold a widened copy).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Sequence

import torch
from torch import nn

from sglang.srt.layers.linear import LinearBase, QKVParallelLinear
from sglang.srt.layers.quantization.config import QuantSpec
from sglang.srt.layers.quantization.fp8_block import FP8_DTYPE, Fp8BlockLinearMethod, block_dequant

SCALE_SUFFIX = "_scale_inv"  # "<module>.weight_scale_inv" beside "<module>.weight"


def _module_of(ckpt_name: str, stacked: Sequence[tuple[str, str, object]]) -> str:
    """The model module a checkpoint `<module>.weight` goes to (fused pieces renamed)."""
    module = ckpt_name.rsplit(".", 1)[0]
    for ckpt_piece, fused_piece, _ in stacked:
        if ckpt_piece in module + ".":
            return (module + ".").replace(ckpt_piece, fused_piece)[:-1]
    return module


def prepare_fp8_model(
    model: nn.Module, spec: QuantSpec, scaled_weights: Iterable[str], stacked: Sequence = ()
) -> set[str]:
    """Make FP8 the linears whose checkpoint weight (named in `scaled_weights`, the names of the
    `weight_scale_inv` tensors) is block-quantized; returns the module names made FP8."""
    skip = tuple(getattr(model, "fp8_unquantized_modules", ()))
    targets = {_module_of(n[: -len(SCALE_SUFFIX)], stacked) for n in scaled_weights}
    method = Fp8BlockLinearMethod(spec.weight_block_size)
    held: set[str] = set()
    for name, module in model.named_modules():
        if name not in targets or not isinstance(module, LinearBase) or isinstance(module, QKVParallelLinear):
            continue
        if name.rsplit(".", 1)[-1] in skip:
            continue
        method.create_weights(module, name)
        held.add(name)
    return held


class Fp8CheckpointStream:
    """Wraps a checkpoint's (name, tensor) stream for a model prepared by `prepare_fp8_model`."""

    def __init__(self, held: set[str], spec: QuantSpec, dtype: Optional[torch.dtype], stacked: Sequence = ()):
        self.held = held
        self.block = spec.weight_block_size
        self.dtype = dtype
        self.stacked = stacked
        self._pending: dict[str, dict[str, torch.Tensor]] = {}

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        if self.dtype is None or not t.is_floating_point() or t.dtype == self.dtype:
            return t
        return t.to(self.dtype)

    def __call__(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            is_scale = name.endswith(".weight" + SCALE_SUFFIX)
            weight_name = name[: -len(SCALE_SUFFIX)] if is_scale else name
            if _module_of(weight_name, self.stacked) in self.held:
                if not is_scale and tensor.dtype != FP8_DTYPE:
                    raise ValueError(
                        f"{name}: expected a float8_e4m3fn weight (it has a scale), got {tensor.dtype}"
                    )
                yield name, tensor
            elif is_scale or tensor.dtype == FP8_DTYPE:
                parts = self._pending.setdefault(weight_name, {})
                parts["scale" if is_scale else "weight"] = tensor
                if len(parts) == 2:
                    del self._pending[weight_name]
                    w = block_dequant(
                        parts["weight"], parts["scale"], self.block, self.dtype or torch.float32
                    )
                    yield weight_name, w
            else:
                yield name, self._cast(tensor)
        if self._pending:
            raise ValueError(
                f"FP8 weights without their scale (or scales without a weight): {sorted(self._pending)[:4]}"
            )
