"""Online W8A8-INT8: `--quantization w8a8_int8` on an unquantized checkpoint.

After the float weights have loaded, every decoder-layer linear (LinearBase under `.layers.`) is
quantized in place, per output row of this rank's shard (symmetric int8, scale = amax / 127, the
checkpoints' format), and runs `W8A8Int8LinearMethod`; its float weight is freed. Routed experts
likewise, per row of each local expert (`W8A8Int8MoEMethod`). Left float, as in the quantized
checkpoints: embeddings and LM head (not decoder linears), norms, the MoE router, the modules the model reads as plain tensors
(`model.fp8_unquantized_modules`, e.g. DeepSeek's kv_b_proj) and the DSA indexer's weights_proj.

A row-parallel rank's rows hold its slice of K, so its scales are those of that slice (an offline
checkpoint's are of the whole row): the same int8 math per rank, slightly different numbers at
tp > 1 than at tp 1.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.moe.experts import FusedMoE
from sglang.srt.layers.quantization.config import W8A8_INT8, quant_spec_from_config
from sglang.srt.layers.quantization.w8a8_int8 import W8A8Int8LinearMethod, channel_quantize_int8
from sglang.srt.layers.quantization.w8a8_moe import W8A8Int8MoEMethod

_KEEP_FLOAT = ("weights_proj",)


@torch.no_grad()
def quantize_online(model: nn.Module, flag: Optional[str]) -> int:
    """Quantize `model`'s decoder linears for `--quantization flag` when its checkpoint is not
    quantized already (a quantized one runs its own format); returns how many were quantized."""
    if flag is None or quant_spec_from_config(getattr(model, "config", None)) is not None:
        return 0
    if flag != W8A8_INT8:
        raise ValueError(
            f"--quantization {flag}: online quantization is built for {W8A8_INT8} only (issue 30)"
        )
    skip = set(getattr(model, "fp8_unquantized_modules", ())) | set(_KEEP_FLOAT)
    method = W8A8Int8LinearMethod()
    count = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, FusedMoE):
            _quantize_experts(module)
            count += 1
            continue
        if (
            not isinstance(module, LinearBase)
            or module.quant_method is not None
            or ".layers." not in f".{name}"
            or name.rsplit(".", 1)[-1] in skip
        ):
            continue
        q, scale = channel_quantize_int8(module.weight.detach())
        method.create_weights(module, name)
        module.weight.data.copy_(q)
        module.weight_scale.data.copy_(scale)
        count += 1
    return count


def _quantize_experts(moe: FusedMoE) -> None:
    """Routed experts in int8, per row of each local expert's gate / up and down slice."""
    w13, w2 = moe.w13_weight.detach(), moe.w2_weight.detach()
    W8A8Int8MoEMethod().create_weights(moe)
    for w, qw, qs in ((w13, moe.w13_weight, moe.w13_weight_scale), (w2, moe.w2_weight, moe.w2_weight_scale)):
        for e in range(w.shape[0]):
            q, scale = channel_quantize_int8(w[e])
            qw.data[e].copy_(q)
            qs.data[e].copy_(scale)
