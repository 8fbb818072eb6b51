"""Checkpoint routing shared by every model: HF-named full tensors -> this stage's parameters.

Each tensor goes to one parameter: routed-expert weights through the experts' loader
(`match_expert_weight`), fused projections through their shard ids (`stacked`: checkpoint piece ->
fused piece, shard id; the model's stacked-params table), everything else by its own name. Tied
embeddings and the layers of other pipeline stages (or past num_hidden_layers, e.g. DeepSeek's MTP
layers) are handled once here. Each parameter's `weight_loader` takes the FULL tensor and copies
this rank's slice. A quantized checkpoint (`quantization_config`: FP8 block, W8A8-INT8) goes through
`layers/quantization/loading.quantized_weights` first; quantization scales elsewhere are refused.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Optional, Sequence, Union

import torch
from torch import nn

from sglang.srt.layers.moe.experts import match_expert_weight
from sglang.srt.layers.quantization.config import quant_spec_from_config
from sglang.srt.layers.quantization.loading import quantized_weights
from sglang.srt.mem_cache.kv_dtype import kv_scale_target
from sglang.srt.models.checkpoint_specs import StackedParam

LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")
_HEAD_NAMES = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")


def load_checkpoint_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked: Sequence[StackedParam],
    layers: tuple[int, int],
    tie_word_embeddings: bool,
    check: Optional[Callable[[str], None]] = None,
) -> set[str]:
    """Load into `model` (a CausalLM holding global layers [layers[0], layers[1])); returns the names
    of the parameters filled. `check(name)` may raise for tensors the model cannot take."""
    params = dict(model.named_parameters())  # a tied head shares (and is listed as) the embedding
    separate_head = "lm_head.weight" in params
    start, end = layers
    loaded: set[str] = set()
    spec = quant_spec_from_config(getattr(model, "config", None))
    # quantized (layers/quantization): linears made FP8 / int8 as their tensors come
    weights = (
        (n, t) for n, t in weights if kv_scale_target(n) is None
    )  # KV scales: the pool's (kv_dtype.py)
    weights = quantized_weights(model, spec, weights, stacked, lambda i: start <= i < end, params)
    for name, tensor in weights:
        if "rotary_emb.inv_freq" in name:
            continue
        if check is not None:
            check(name)
        m = LAYER_RE.match(name)
        if m and not start <= int(m.group(1)) < end:
            continue  # a layer of another pipeline stage
        if name == "lm_head.weight" and tie_word_embeddings:
            continue  # tied: the head is the embedding weight
        if name == "model.embed_tokens.weight" and tie_word_embeddings and separate_head:
            load_param(params, "lm_head.weight", tensor, None, loaded)  # last stage, no embedding
        if name in _HEAD_NAMES and name not in params:
            continue  # held by another pipeline stage
        expert = match_expert_weight(name)
        if expert is not None:
            load_param(params, expert[0], tensor, expert[1], loaded)
            continue
        for ckpt_piece, fused_piece, shard_id in stacked:
            if ckpt_piece in name:
                load_param(params, name.replace(ckpt_piece, fused_piece), tensor, shard_id, loaded)
                break
        else:
            load_param(params, name, tensor, None, loaded)
    return loaded


def load_param(
    params: dict[str, nn.Parameter],
    name: str,
    tensor: torch.Tensor,
    shard_id: Union[int, str, tuple[str, int], None],
    loaded: set[str],
) -> None:
    """Copy `tensor` into `params[name]` through its `weight_loader` (plain copy when it has none)."""
    param = params.get(name)
    if param is None:
        raise ValueError(f"checkpoint tensor {name!r} matches no model parameter")
    loader = getattr(param, "weight_loader", None)
    if loader is not None:
        if shard_id is None:
            loader(param, tensor)
        else:
            loader(param, tensor, shard_id)
    else:
        if tuple(param.shape) != tuple(tensor.shape):
            raise ValueError(
                f"{name}: shape mismatch, model {tuple(param.shape)} vs checkpoint {tuple(tensor.shape)}"
            )
        param.data.copy_(tensor)
    loaded.add(name)
