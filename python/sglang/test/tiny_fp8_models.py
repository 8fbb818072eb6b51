"""A tiny FP8 block-quantized DeepSeek-V3.2 checkpoint (DeepSeek's format) and its float32 twin.

`save_fp8_pair(out_dir)` writes `fp8/` (float8_e4m3fn weights with `weight_scale_inv`, config.json
with `quantization_config`) and `dequant/` (the same weights dequantized to float32, no
quantization_config), both from the tiny float32 V3.2 of `tiny_moe_models.save_tiny_v32`.
Quantized like the real checkpoints: every 2-D linear weight of the decoder layers, except the MoE
router (`mlp.gate`) and the indexer's `weights_proj`; embeddings, LM head and norms stay as they are.
"""

from __future__ import annotations

import os
from typing import Optional

from sglang.srt.layers.quantization.fp8_block import block_dequant, block_quantize
from sglang.test.quantized_checkpoints import write_quantized_pair
from sglang.test.tiny_moe_models import save_tiny_v32

BLOCK = (16, 16)  # the tiny dims are small; the real checkpoints use 128 x 128


def is_quantized(name: str, ndim: int) -> bool:
    return (
        ndim == 2
        and name.startswith("model.layers.")
        and name.endswith(("_proj.weight", "_proj_with_mqa.weight"))
        and not name.endswith("weights_proj.weight")
    ) or (ndim == 2 and name.endswith((".wq_b.weight", ".wk.weight")))


def save_fp8_pair(
    out_dir, block: tuple[int, int] = BLOCK, scale_fmt: Optional[str] = None
) -> tuple[str, str]:
    """(fp8 checkpoint dir, dequantized float32 checkpoint dir) of the tiny V3.2; `scale_fmt="ue8m0"`:
    power-of-two block scales and `scale_fmt` in the config, as V3.1 / V3.2 ship."""
    src = save_tiny_v32(os.path.join(str(out_dir), "src"))

    def quantize(name, t):
        q, s = block_quantize(t, block, scale_fmt)
        return {"": q, "_scale_inv": s}, block_dequant(q, s, block, t.dtype)

    config = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "weight_block_size": list(block),
        "activation_scheme": "dynamic",
    }
    if scale_fmt is not None:
        config["scale_fmt"] = scale_fmt
    return write_quantized_pair(src, out_dir, "fp8", lambda n, t: is_quantized(n, t.dim()), quantize, config)
