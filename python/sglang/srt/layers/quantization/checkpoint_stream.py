"""The checkpoint stream of a quantized checkpoint, shared by its formats (FP8 block, W8A8-INT8).

`QuantCheckpointStream` wraps the (name, tensor) stream of a checkpoint. The first quantized weight
(the format's 1-byte dtype) or scale (`<module>.weight<scale_suffix>`) of a linear layer the method
serves turns that layer quantized (`method.create_weights`, before any of its tensors loads), and
its weights and scales pass through unchanged. Routed experts (`FusedMoE`) likewise through
`moe_method` where it fits them: their weights go on to the experts' loader, their per-expert
scales are loaded here (`moe_method.load_scale`). Modules the methods do not serve get their
weight dequantized once, at load (weight and scale paired as they arrive), and hold a widened copy:
the modules the model reads as plain tensors (`model.fp8_unquantized_modules`, e.g. DeepSeek's
kv_b_proj, absorbed into the attention), experts whose scale blocks do not fit, and whatever the
format excludes. An untied LM head whose weight comes quantized is served by `head_method` where
the format has one (W8A8-INT8: `w8a8_head.py`), else widened; a tied head is the embedding.
Tensors of layers outside this pipeline stage pass through untouched (the loader skips them).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.moe.experts import FusedMoE, match_expert_weight
from sglang.srt.layers.vocab_embedding import ParallelLMHead

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


def module_of(weight_name: str, stacked: Sequence[tuple[str, str, object]]) -> str:
    """The model module a checkpoint `<module>.weight` goes to (fused pieces renamed)."""
    module = weight_name.rsplit(".", 1)[0] + "."
    for ckpt_piece, fused_piece, _ in stacked:
        if ckpt_piece in module:
            return module.replace(ckpt_piece, fused_piece)[:-1]
    return module[:-1]


class QuantCheckpointStream:
    """Wraps a checkpoint's (name, tensor) stream for `model` (quantized linears made as they come).

    Subclasses set `label`, `quant_dtype`, `scale_suffix`, `method` and `dequant(weight, scale)`, and may
    narrow `serves(layer)`."""

    label: str  # the format in messages ("FP8", "int8")
    quant_dtype: torch.dtype
    scale_suffix: str  # "<module>.weight<scale_suffix>" beside "<module>.weight"
    method: Any
    moe_method: Any = None  # keeps routed experts quantized where it `fits` them (else widened)
    head_method: Any = None  # keeps an untied LM head quantized (else widened)

    def __init__(
        self,
        model: nn.Module,
        stacked: Sequence,
        in_stage: Callable[[int], bool],
        params: dict[str, nn.Parameter],
    ):
        """`params`: the loader's name -> parameter table, updated as layers are made quantized."""
        skip = set(getattr(model, "fp8_unquantized_modules", ()))
        self.linears = {
            name: (m, self.method)
            for name, m in model.named_modules()
            if isinstance(m, LinearBase) and self.serves(m) and name.rsplit(".", 1)[-1] not in skip
        }
        if self.head_method is not None and not getattr(model, "tie_word_embeddings", False):
            heads = {n: m for n, m in model.named_modules() if isinstance(m, ParallelLMHead)}
            self.linears.update({name: (m, self.head_method) for name, m in heads.items()})
        self.moes = {
            name: m
            for name, m in model.named_modules()
            if isinstance(m, FusedMoE) and self.moe_method is not None and self.moe_method.fits(m)
        }
        self.stacked = stacked
        self.in_stage = in_stage
        self.params = params
        self.held: set[str] = set()  # module names made quantized
        self._pending: dict[str, dict[str, torch.Tensor]] = {}

    def serves(self, layer: LinearBase) -> bool:
        return True

    def dequant(self, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def check_scale(self, name: str, scale: torch.Tensor) -> None:
        """A format's check of each scale tensor as it arrives (ValueError naming it); none here."""

    def __call__(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        suffix = ".weight" + self.scale_suffix
        for name, tensor in weights:
            is_scale = name.endswith(suffix)
            m = _LAYER_RE.match(name)
            if (m and not self.in_stage(int(m.group(1)))) or not (
                is_scale or tensor.dtype == self.quant_dtype
            ):
                self._check_float(name)
                yield name, tensor
                continue
            if is_scale:
                self.check_scale(name, tensor)
            weight_name = name[: -len(self.scale_suffix)] if is_scale else name
            expert = match_expert_weight(weight_name)
            if (
                expert is not None
                and isinstance(expert[1], tuple)
                and expert[0].rsplit(".", 1)[0] in self.moes
            ):
                self._expert_tensor(expert[0].rsplit(".", 1)[0], expert[1], tensor, is_scale)
                if not is_scale:
                    yield name, tensor  # the experts' loader copies this rank's part
                continue
            module = module_of(weight_name, self.stacked)
            if module in self.linears:
                if module not in self.held:
                    self._make_quantized(module)
                yield name, tensor
                continue
            parts = self._pending.setdefault(weight_name, {})
            parts["scale" if is_scale else "weight"] = tensor
            if len(parts) == 2:  # widened once; the parameter's copy casts it to the model dtype
                del self._pending[weight_name]
                yield weight_name, self.dequant(parts["weight"], parts["scale"])
        if self._pending:
            raise ValueError(
                f"{self.label} weights without their scale (or scales without a weight): {sorted(self._pending)[:4]}"
            )

    def _expert_tensor(self, moe_name: str, shard: tuple, tensor: torch.Tensor, is_scale: bool) -> None:
        moe = self.moes[moe_name]
        if moe_name not in self.held:
            self.moe_method.create_weights(moe)
            for p in ("w13_weight", "w2_weight"):
                self.params[f"{moe_name}.{p}"] = getattr(moe, p)
            self.held.add(moe_name)
        if is_scale:  # loaded here: the scale has no checkpoint name of its own in the model
            self.moe_method.load_scale(moe, shard[0], int(shard[1]), tensor)

    def _make_quantized(self, module: str) -> None:
        layer, method = self.linears[module]
        method.create_weights(layer, module)
        self.params[module + ".weight"] = layer.weight
        self.params[module + ".weight" + self.scale_suffix] = getattr(layer, "weight" + self.scale_suffix)
        self.held.add(module)

    def _check_float(self, name: str) -> None:
        """A float weight for a layer already made quantized (the checkpoint mixes formats in one layer)."""
        if name.endswith(".weight") and module_of(name, self.stacked) in self.held:
            raise ValueError(
                f"{name}: a float weight for a layer whose other checkpoint pieces are {self.label}"
            )
