"""Prepacked linear weights (oneDNN, or the kernels' bf16_linear) for bf16 on CPU.

`F.linear` on a plain bf16 weight re-lays the weight out for the GEMM kernel at every call. After
loading, `prepack_linear_weights` asks the platform whether it has a packed-weight linear for the
model dtype (`Platform.prepacked_linear`) and, if so, packs every linear layer's weight once into
the kernel's blocked layout; `linear()` then calls the packed kernel. Float routed experts
(`FusedMoE`) likewise: each expert's w13 and w2, which its expert loop then runs through the same
kernel (the SwiGLU gate in w13's epilogue where the kernel has one). The plain weight stays in
place (loading, tied embeddings and state_dict keep working); the packed copy is a plain
attribute, not a parameter. Results are identical to the plain GEMM (speed-ups: docs/benchmarks.md).

Disable with SGLANG_CPU_PREPACK_LINEAR=0. Weights must not change after packing.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from sglang.srt import envs

logger = logging.getLogger(__name__)

PackedLinear = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor]], torch.Tensor]


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    packed: Optional[tuple[torch.Tensor, PackedLinear]],
) -> torch.Tensor:
    """F.linear(x, weight, bias), through the packed kernel when the layer was prepacked."""
    if packed is None or x.dtype != weight.dtype or x.numel() == 0:
        return F.linear(x, weight, bias)
    packed_weight, kernel = packed
    if x.dim() == 2 and x.is_contiguous():  # the usual case: no reshapes (~3 us a call, 120 calls a step)
        return kernel(x, packed_weight, bias)
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    out = kernel(x2, packed_weight, bias)
    return out.view(*x.shape[:-1], out.shape[-1])


def prepack_linear_weights(model: torch.nn.Module, platform, max_bytes: Optional[int] = None) -> int:
    """Pack the weight of every module with a `packed_weight` slot (unless it sets `skip_prepack`:
    its own kernel holds a packed copy), and let quantized linears pack theirs (`pack_quantized_linears`);
    returns the bytes the packed copies take (the plain weights stay, so the memory budget must count these too).

    max_bytes: when the copies would take more (a large model on a small host), nothing is packed
    and a warning says so."""
    if not envs.SGLANG_CPU_PREPACK_LINEAR.get():
        return 0
    quantized_bytes = pack_quantized_linears(model)
    todo = []
    for module in model.modules():
        weight = _packable_weight(module)
        backend = None if weight is None else platform.prepacked_linear(weight.dtype, weight.device)
        if backend is not None:
            todo.append((module, weight, backend))
    total = sum(_weight_bytes(m) for m, _, _ in todo)
    if max_bytes is not None and total > max_bytes:
        logger.warning(
            "not prepacking linear weights: the packed copies (%.0f MiB) exceed the %.0f MiB allowed",
            total / 2**20,
            max_bytes / 2**20,
        )
        return quantized_bytes
    count = nbytes = 0
    for module, weight, (pack, kernel) in todo:
        if hasattr(module, "packed_experts"):  # routed experts (FusedMoE): w13 and w2 of each
            w13, w2 = module.w13_weight.detach(), module.w2_weight.detach()
            module.packed_experts = ([(pack(w13[e]), pack(w2[e])) for e in range(w13.shape[0])], kernel)
        else:
            module.packed_weight = (pack(weight.detach()), kernel)
        count += 1
        nbytes += _weight_bytes(module)  # the blocked layout holds the same values
    if count:
        logger.info(
            "prepacked %d linear weights (%.0f MiB) for the %s kernel", count, nbytes / 2**20, platform.name
        )
    return nbytes + quantized_bytes


def _packable_weight(module: torch.nn.Module) -> Optional[torch.Tensor]:
    """The float weight the platform may pack for `module`: a linear's 2-D weight (a module with a
    `packed_weight` slot and no `skip_prepack`), or the w13 of float routed experts (a FusedMoE's
    `packed_experts` slot, no quant method); else None."""
    if hasattr(module, "packed_experts"):
        return None if module.quant_method is not None else module.w13_weight
    if not hasattr(module, "packed_weight") or getattr(module, "skip_prepack", False):
        return None
    weight = getattr(module, "weight", None)
    return weight if weight is not None and weight.dim() == 2 else None


def _weight_bytes(module: torch.nn.Module) -> int:
    tensors = (module.w13_weight, module.w2_weight) if hasattr(module, "packed_experts") else (module.weight,)
    return sum(t.numel() * t.element_size() for t in tensors)


def pack_quantized_linears(model: torch.nn.Module) -> int:
    """Quantized linears whose method packs its weight for a fused kernel (`pack_weights`, e.g.
    W8A8-INT8's, whose packed copy replaces the plain weight; it returns the bytes it added, or None
    when it packed nothing): packed once here; returns the bytes this adds to the weights counted before."""
    count = nbytes = 0
    for module in model.modules():
        pack = getattr(getattr(module, "quant_method", None), "pack_weights", None)
        # a linear's weight, or routed experts' w13 / w2 (FusedMoE)
        has_weights = getattr(module, "weight", None) is not None or hasattr(module, "w13_weight")
        added = pack(module) if pack is not None and has_weights else None
        if added is not None:  # None: the method packed nothing for this layer
            nbytes += added
            count += 1
    if count:
        logger.info(
            "packed %d quantized linear weights for their fused kernels (%+.1f MiB)", count, nbytes / 2**20
        )
    return nbytes
