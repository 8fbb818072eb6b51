"""Tiny W8A8-INT8 checkpoints in the real formats, and their float32 twins.

`save_w8a8_pair(out_dir, fmt)` writes `<fmt>/` (int8 weights with a float32 per-row `weight_scale`
[N, 1], config.json with `quantization_config`) and `dequant/` (weight x scale in float32, no
quantization_config). `fmt`: "w8a8_int8" (SGLang's `quant_method: w8a8_int8`) or
"compressed-tensors" (llm-compressor's W8A8-INT8 config: int8 channel weights, dynamic per-token
int8 activations, symmetric, `ignore: [lm_head]`). Source: the tiny llama with seeded random
weights (`tiny_models`), or the tiny DeepSeek-V3.2 (`model="v32"`). Every 2-D decoder `*_proj`
weight is quantized (fused QKV / gate-up pieces too); embeddings, norms, the MoE router stay float,
and so does the LM head unless `head=True` (the tiny llama's head is untied; compressed-tensors
then names it among its targets, `re:.*lm_head`, and no longer ignores it).
"""

from __future__ import annotations

import os

from sglang.srt.layers.quantization.w8a8_int8 import channel_quantize_int8
from sglang.test.quantized_checkpoints import write_quantized_pair
from sglang.test.tiny_fp8_models import is_quantized
from sglang.test.tiny_models import TINY_LLAMA_DIR, write_random_checkpoint

_INT8_SCHEME = {"num_bits": 8, "type": "int", "symmetric": True}
COMPRESSED_TENSORS_W8A8 = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {**_INT8_SCHEME, "strategy": "channel", "dynamic": False, "observer": "minmax"},
            "input_activations": {**_INT8_SCHEME, "strategy": "token", "dynamic": True, "observer": None},
        }
    },
}
W8A8_INT8 = {"quant_method": "w8a8_int8", "activation_scheme": "dynamic"}


def w8a8_config(fmt: str, head: bool = False) -> dict:
    """The `quantization_config` of a W8A8-INT8 checkpoint in `fmt`; `head`: its LM head quantized
    too (compressed-tensors: `re:.*lm_head` among the targets and nothing ignored, the form upstream
    SGLang and vLLM load a quantized head from)."""
    if fmt != "compressed-tensors":
        return W8A8_INT8
    if not head:
        return COMPRESSED_TENSORS_W8A8
    group = {**COMPRESSED_TENSORS_W8A8["config_groups"]["group_0"], "targets": ["Linear", "re:.*lm_head"]}
    return {**COMPRESSED_TENSORS_W8A8, "ignore": [], "config_groups": {"group_0": group}}


def save_w8a8_pair(
    out_dir, fmt: str = "w8a8_int8", model: str = "llama", head: bool = False
) -> tuple[str, str]:
    """(int8 checkpoint dir, dequantized float32 checkpoint dir); `head`: the LM head in int8 too."""
    if model == "llama":
        src = write_random_checkpoint(TINY_LLAMA_DIR, os.path.join(str(out_dir), "src"), seed=0)
    else:
        from sglang.test.tiny_moe_models import save_tiny_v32

        src = save_tiny_v32(os.path.join(str(out_dir), "src"))

    def quantize(name, t):
        q, s = channel_quantize_int8(t)
        return {"": q, "_scale": s}, (q.float() * s).to(t.dtype)

    config = w8a8_config(fmt, head)

    def select(name, t):
        return is_quantized(name, t.dim()) or (head and name == "lm_head.weight")

    return write_quantized_pair(src, out_dir, fmt, select, quantize, config)


class FakeQuantReference:
    """The W8A8-INT8 math in float32 torch, for a model loaded from the dequantized twin: each
    activation row is quantized per token to int8 and widened back (per slice of K/`row_shards`
    for row-parallel layers, as each of that many tp ranks quantizes its own slice), then
    multiplied by the float32 (already dequantized) weight."""

    def __init__(self, row_shards: int = 1, moe_row_shards: int = -1):
        """`moe_row_shards`: the MoE-tp size (the routed experts' down projection); -1: row_shards."""
        self.row_shards = row_shards
        self.moe_row_shards = row_shards if moe_row_shards < 0 else moe_row_shards

    def _fake(self, x, shards: int):
        from sglang.srt.layers.quantization.w8a8_int8 import per_token_quant_int8

        rows = x.reshape(-1, x.shape[-1] // shards)
        q, s = per_token_quant_int8(rows)
        return (q.float() * s).reshape(x.shape).to(x.dtype)

    def apply(self, layer, x, *args):
        """A linear's (x, bias) or a FusedMoE's (x, topk_weights, topk_ids), whose down projection
        is row-parallel over the MoE-tp ranks."""
        import torch.nn.functional as F

        from sglang.srt.layers.linear import RowParallelLinear
        from sglang.srt.layers.moe.experts import FusedMoE, fused_experts_ref

        if isinstance(layer, FusedMoE):

            def linear(rows, w, e):
                return F.linear(self._fake(rows, self.moe_row_shards if w is layer.w2_weight else 1), w[e])

            return fused_experts_ref(x, layer.w13_weight, layer.w2_weight, *args, layer.expert_start, linear)
        shards = self.row_shards if isinstance(layer, RowParallelLinear) else 1
        return F.linear(self._fake(x, shards), layer.weight, args[0])


def fake_quant_linears(model, row_shards: int = 1, moe_row_shards: int = -1, head: bool = False) -> int:
    """Install `FakeQuantReference` on every linear and routed-expert block of `model` that the
    int8 checkpoint holds in int8 (the weights `save_w8a8_pair` quantizes, less those its model
    reads as plain tensors; `head`: the LM head too); returns how many."""
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.moe.experts import FusedMoE
    from sglang.srt.layers.vocab_embedding import ParallelLMHead

    n = 0
    method = FakeQuantReference(row_shards, moe_row_shards)
    skip = set(getattr(model, "fp8_unquantized_modules", ()))
    for name, m in model.named_modules():
        local = name.removeprefix("model.").split(".", 2)[-1] if ".layers." in name else name
        if (
            isinstance(m, LinearBase)
            and name.rsplit(".", 1)[-1] not in skip
            and is_quantized("model.layers.0." + local + ".weight", 2)
        ):
            m.quant_method = method
            n += 1
        elif isinstance(m, FusedMoE) or (head and isinstance(m, ParallelLMHead)):  # experts: all quantized
            m.quant_method = method
            n += 1
    return n
