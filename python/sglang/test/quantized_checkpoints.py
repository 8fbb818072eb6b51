"""Write a quantized twin of a float checkpoint, in a real format, beside the same weights
dequantized to float32 (the reference a parity test runs).

`write_quantized_pair(src, out_dir, tag, select, quantize, quant_config)` reads `src`'s
model.safetensors, and for every tensor `select(name, tensor)` accepts stores what
`quantize(name, tensor)` returns ({suffix: tensor}: "" the weight, e.g. "_scale" its scale) in
`<out_dir>/<tag>/` and the given dequantized tensor in `<out_dir>/dequant/`; other tensors are
copied to both. config.json of `<tag>/` gets `quantization_config`; `dequant/` has none.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Callable, Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file

# (name, tensor) -> ({suffix: stored tensor}, dequantized float tensor)
Quantize = Callable[[str, torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]]


def write_quantized_pair(
    src: str,
    out_dir: str,
    tag: str,
    select: Callable[[str, torch.Tensor], bool],
    quantize: Quantize,
    quant_config: dict,
    dequant: bool = True,
) -> tuple[str, Optional[str]]:
    """(quantized checkpoint dir, dequantized float checkpoint dir or None without `dequant`)."""
    q_dir, deq_dir = os.path.join(str(out_dir), tag), os.path.join(str(out_dir), "dequant")
    for d in (q_dir, deq_dir) if dequant else (q_dir,):
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("*.safetensors*"))
    quantized, deq = {}, {}
    with safe_open(os.path.join(src, "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if select(name, t):
                stored, deq[name] = quantize(name, t)
                for suffix, tensor in stored.items():
                    quantized[name + suffix] = tensor
            else:
                quantized[name] = deq[name] = t
    save_file(quantized, os.path.join(q_dir, "model.safetensors"), metadata={"format": "pt"})
    if dequant:
        save_file(deq, os.path.join(deq_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg_path = os.path.join(q_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = quant_config
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    return q_dir, deq_dir if dequant else None
