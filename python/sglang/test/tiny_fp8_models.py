"""A tiny FP8 block-quantized DeepSeek-V3.2 checkpoint (DeepSeek's format) and its float32 twin.

`save_fp8_pair(out_dir)` writes `fp8/` (float8_e4m3fn weights with `weight_scale_inv`, config.json
with `quantization_config`) and `dequant/` (the same weights dequantized to float32, no
quantization_config), both from the tiny float32 V3.2 of `tiny_moe_models.save_tiny_v32`.
Quantized like the real checkpoints: every 2-D linear weight of the decoder layers, except the MoE
router (`mlp.gate`) and the indexer's `weights_proj`; embeddings, LM head and norms stay as they are.
"""

from __future__ import annotations

import json
import os
import shutil

from safetensors import safe_open
from safetensors.torch import save_file

from sglang.srt.layers.quantization.fp8_block import block_dequant, block_quantize
from sglang.test.tiny_moe_models import save_tiny_v32

BLOCK = (16, 16)  # the tiny dims are small; the real checkpoints use 128 x 128


def is_quantized(name: str, ndim: int) -> bool:
    return (
        ndim == 2
        and name.startswith("model.layers.")
        and name.endswith(("_proj.weight", "_proj_with_mqa.weight"))
        and not name.endswith("weights_proj.weight")
    ) or (ndim == 2 and name.endswith((".wq_b.weight", ".wk.weight")))


def save_fp8_pair(out_dir, block: tuple[int, int] = BLOCK) -> tuple[str, str]:
    """(fp8 checkpoint dir, dequantized float32 checkpoint dir) of the tiny V3.2."""
    src = save_tiny_v32(os.path.join(str(out_dir), "src"))
    fp8_dir, deq_dir = os.path.join(str(out_dir), "fp8"), os.path.join(str(out_dir), "dequant")
    for d in (fp8_dir, deq_dir):
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("*.safetensors*"))
    fp8, deq = {}, {}
    with safe_open(os.path.join(src, "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if is_quantized(name, t.dim()):
                q, s = block_quantize(t, block)
                fp8[name], fp8[name + "_scale_inv"] = q, s
                deq[name] = block_dequant(q, s, block, t.dtype)
            else:
                fp8[name] = deq[name] = t
    save_file(fp8, os.path.join(fp8_dir, "model.safetensors"), metadata={"format": "pt"})
    save_file(deq, os.path.join(deq_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg_path = os.path.join(fp8_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "weight_block_size": list(block),
        "activation_scheme": "dynamic",
    }
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    return fp8_dir, deq_dir
