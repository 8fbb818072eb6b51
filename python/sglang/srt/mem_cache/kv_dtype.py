"""`--kv-cache-dtype`: the dtype the KV pool stores, and the checkpoint's per-layer KV scales.

Values (upstream SGLang's): `auto` stores K/V in the model dtype; `bf16` / `bfloat16` in bfloat16;
`fp8_e4m3` / `fp8_e5m2` in 1 byte (`torch.float8_e4m3fn` / `torch.float8_e5m2`) as `x / scale`,
widened back (`* scale`) by every attention backend that reads the pool. The scale of a layer is
1.0 unless the safetensors checkpoint holds it, under upstream's names:
`model.layers.N.self_attn.{k_scale, v_scale}` (also under `.attn.`, `.k_proj.` / `.v_proj.`),
`...self_attn.kv_scale` (both), or ModelOpt's `...self_attn.{k,v}_proj.output_scale`.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Optional

import torch

KV_CACHE_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}

_SCALE_RE = re.compile(
    r"^model\.layers\.(\d+)\.self_attn\.(?:(?:attn|k_proj|v_proj)\.)?(k_scale|v_scale|kv_scale)$"
    r"|^model\.layers\.(\d+)\.self_attn\.([kv])_proj\.output_scale$"
)


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The stored dtype of `--kv-cache-dtype name` for a model computing in `model_dtype`."""
    if name == "auto":
        return model_dtype
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype must be one of {['auto', *KV_CACHE_DTYPES]}, got {name!r}")
    return KV_CACHE_DTYPES[name]


def kv_scale_target(name: str) -> Optional[tuple[int, str]]:
    """(layer, "k" | "v" | "kv") when checkpoint tensor `name` is a KV cache scale, else None."""
    m = _SCALE_RE.match(name)
    if m is None:
        return None
    if m.group(1) is not None:
        return int(m.group(1)), m.group(2)[: -len("_scale")]
    return int(m.group(3)), m.group(4)


def read_kv_scales(model_path: str) -> dict[int, tuple[Optional[float], Optional[float]]]:
    """layer -> (k_scale, v_scale) found in the safetensors files of `model_path` (a directory;
    anything else has none). Only the tensors' names are listed; the scalars alone are read."""
    if not os.path.isdir(model_path):
        return {}
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    found: dict[int, list[Optional[float]]] = {}
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                target = kv_scale_target(name)
                if target is None:
                    continue
                layer, which = target
                value = float(f.get_tensor(name).float().reshape(-1).max())
                entry = found.setdefault(layer, [None, None])
                if which in ("k", "kv"):
                    entry[0] = value
                if which in ("v", "kv"):
                    entry[1] = value
    return {layer: (k, v) for layer, (k, v) in found.items()}


def apply_kv_scales(pool, scales: dict[int, tuple[Optional[float], Optional[float]]]) -> int:
    """Give the pool the scales of the layers it holds (FP8 pools only: other dtypes store values
    unscaled); returns how many layers got one. A missing scale stays 1.0."""
    if not getattr(pool, "is_fp8", False):
        return 0
    applied = 0
    for layer, (k, v) in scales.items():
        if not pool.start_layer <= layer < pool.end_layer:
            continue
        old_k, old_v = pool.kv_scales(layer)
        pool.set_kv_scales(layer, old_k if k is None else k, old_v if v is None else v)
        applied += 1
    return applied
