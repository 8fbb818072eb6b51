"""Load a W8A8-INT8 checkpoint (SGLang's `w8a8_int8`, compressed-tensors int8): the shared
`checkpoint_stream.QuantCheckpointStream` with int8 weights and per-row `weight_scale`."""

from __future__ import annotations

import torch

from sglang.srt.layers.quantization.checkpoint_stream import QuantCheckpointStream
from sglang.srt.layers.quantization.w8a8_head import W8A8Int8HeadMethod
from sglang.srt.layers.quantization.w8a8_int8 import W8A8Int8LinearMethod
from sglang.srt.layers.quantization.w8a8_moe import W8A8Int8MoEMethod


class Int8CheckpointStream(QuantCheckpointStream):
    """A W8A8-INT8 checkpoint's stream: every linear (fused QKV and gate/up included) and routed
    expert (`w8a8_moe.py`) whose weight is int8 keeps it in 1 byte; int8 weights of other modules
    (DeepSeek's kv_b_proj) are widened once at load (weight x its row's scale). An untied LM head
    stored in int8 stays int8 (`w8a8_head.py`)."""

    label = "int8"
    quant_dtype = torch.int8
    scale_suffix = "_scale"
    method = W8A8Int8LinearMethod()
    moe_method = W8A8Int8MoEMethod()
    head_method = W8A8Int8HeadMethod()  # an untied head stored in int8 stays int8

    def dequant(self, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return weight.float() * scale.float().reshape(-1, 1)
