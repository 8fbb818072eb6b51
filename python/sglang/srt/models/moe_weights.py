"""Checkpoint routing shared by the MoE models (DeepSeek-V3/V3.2, Qwen3-MoE).

HF-named full tensors go to this pipeline stage's parameters: per-expert weights through the
experts' loader, fused projections (`stacked`: checkpoint piece -> fused piece, shard id) through
their shard ids, tied embeddings and other stages' layers handled once here.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Optional, Sequence, Union

import torch
from torch import nn

from sglang.srt.layers.moe.experts import match_expert_weight
from sglang.srt.models.llama import LlamaForCausalLM

LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")
_HEAD_NAMES = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")


def load_moe_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked: Sequence[tuple[str, str, Union[int, str]]],
    check: Optional[Callable[[str], None]] = None,
) -> set[str]:
    """Load into `model` (a CausalLM with start_layer/end_layer/tie_word_embeddings); returns the
    names of the parameters filled. `check(name)` may raise for tensors the model cannot take;
    layers outside this stage (or past num_hidden_layers, e.g. MTP layers) are skipped."""
    params = dict(model.named_parameters())
    separate_head = "lm_head.weight" in params
    loaded: set[str] = set()
    load = LlamaForCausalLM._load_param
    for name, tensor in weights:
        if "rotary_emb.inv_freq" in name:
            continue
        if check is not None:
            check(name)
        m = LAYER_RE.match(name)
        if m and not model.start_layer <= int(m.group(1)) < model.end_layer:
            continue
        if name == "lm_head.weight" and model.tie_word_embeddings:
            continue
        if name == "model.embed_tokens.weight" and model.tie_word_embeddings and separate_head:
            load(params, "lm_head.weight", tensor, None, loaded)
        if name in _HEAD_NAMES and name not in params:
            continue
        expert = match_expert_weight(name)
        if expert is not None:
            load(params, expert[0], tensor, expert[1], loaded)
            continue
        for ckpt_piece, fused_piece, shard_id in stacked:
            if ckpt_piece in name:
                load(params, name.replace(ckpt_piece, fused_piece), tensor, shard_id, loaded)
                break
        else:
            load(params, name, tensor, None, loaded)
    return loaded
