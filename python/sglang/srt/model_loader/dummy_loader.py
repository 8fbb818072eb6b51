"""Deterministic random ("dummy") weights for runs without a checkpoint.

Values depend only on (`seed`, tensor name, shape), drawn in float32 from a CPU generator seeded per
tensor, then cast: not on dtype, device, or which other tensors exist.

- 1-D tensors whose name contains "norm" (RMSNorm / LayerNorm weights): 1.0 (biases of norms: 0.0).
- everything else (matrices, embeddings, biases): normal(0, std), default std 0.02.

Two paths:
- `CausalLM` models (every registered model) get FULL checkpoint-level tensors, keyed by HF name
  (`dummy_weight_specs(config)` -> [(hf_name, full_shape)], derived from the model), streamed
  through `model.load_weights`; each parameter's `weight_loader` shards them. So dummy weights are
  identical across tensor-parallel sizes and pipeline splits (a rank still draws the full tensors
  of its layers). Every parameter of the stage must be filled that way (else ValueError).
- Other modules (plain `nn.Module`s of unit tests): each parameter is filled directly, keyed by
  its own name and (local) shape.
"""

from __future__ import annotations

import re
import zlib
from typing import Callable, Iterable, Iterator, Optional, Sequence

import torch

from sglang.srt.models.causal_lm import CausalLM

WeightSpec = tuple[str, Sequence[int]]
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


def _param_seed(seed: int, name: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode("utf-8"))) % (2**63 - 1)


def _is_norm(name: str, ndim: int) -> bool:
    return ndim == 1 and "norm" in name.rsplit(".", 1)[0].lower()


def dummy_tensor(name: str, shape: Sequence[int], seed: int, std: float = 0.02) -> torch.Tensor:
    """The float32 dummy value of the tensor called `name` with `shape` (see module docstring)."""
    shape = tuple(int(s) for s in shape)
    if _is_norm(name, len(shape)):
        return torch.full(shape, 0.0 if name.endswith("bias") else 1.0, dtype=torch.float32)
    gen = torch.Generator(device="cpu").manual_seed(_param_seed(seed, name))
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen)


def iter_dummy_weights(
    specs: Iterable[WeightSpec], seed: int, std: float = 0.02, keep: Optional[Callable[[str], bool]] = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full float32 tensor) for every spec that `keep` accepts (all when `keep` is None)."""
    for name, shape in specs:
        if keep is None or keep(name):
            yield name, dummy_tensor(name, shape, seed, std)


def _stage_filter(start: int, end: int) -> Callable[[str], bool]:
    """Skip `model.layers.N.*` tensors outside a pipeline stage's [start, end)."""

    def keep(name: str) -> bool:
        m = _LAYER_RE.match(name)
        return m is None or start <= int(m.group(1)) < end

    return keep


@torch.no_grad()
def _fill_parameters(model: torch.nn.Module, seed: int, std: float) -> None:
    for name, param in model.named_parameters():
        param.copy_(dummy_tensor(name, param.shape, seed, std).to(device=param.device, dtype=param.dtype))


@torch.no_grad()
def init_dummy_weights(model: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Fill every parameter of `model` in place with deterministic values (see module docstring)."""
    if not isinstance(model, CausalLM):
        _fill_parameters(model, seed, std)
        return
    specs = model.dummy_weight_specs(model.config)
    loaded = model.load_weights(
        iter_dummy_weights(specs, seed, std, _stage_filter(model.start_layer, model.end_layer))
    )
    missing = sorted(name for name, _ in model.named_parameters() if name not in loaded)
    if missing:
        raise ValueError(
            f"dummy checkpoint tensors left parameters of {type(model).__name__} unfilled: {missing}"
        )
