"""A W8A8-INT8 LM head: a checkpoint whose untied `lm_head.weight` is int8 with a per-row
`lm_head.weight_scale` (compressed-tensors with the head among its targets, as upstream SGLang and
vLLM load it; or SGLang's `w8a8_int8` format holding the head in int8) keeps the head in 1 byte.

The head runs the linears' W8A8 method (`W8A8Int8LinearMethod`: per-token int8 activations, the
int32 GEMM, both scales; the packed CPU kernel after loading). Its vocab rows shard over the head's
tp ranks like a float head's (`VocabParallelEmbedding.weight_loader`, padding rows zero), and so do
the scales. Under float32 logits (`--enable-fp32-lm-head`, the CPU default) the head is called on
float32 rows and returns float32 logits: the int32 sums scaled in float32, never rounded to bf16.
A tied head is the embedding and stays float (the stream never serves it, `checkpoint_stream.py`).
Decode reads the head's bytes every step: at 1 byte a weight they halve against bf16
(docs/benchmarks.md, issue 30)."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.layers.quantization.w8a8_int8 import W8A8Int8LinearMethod


class W8A8Int8HeadMethod(W8A8Int8LinearMethod):
    """`W8A8Int8LinearMethod` for a `ParallelLMHead` (vocab-sharded rows; `apply` and `pack_weights`
    are the linears')."""

    def scale_loader(self, layer: nn.Module, name: str):
        """The head's scale loads by the head's vocab rows (padding rows 0), as its weight does
        (`VocabParallelEmbedding.weight_loader`, which `create_weights` gives the int8 weight)."""
        return _head_scale_loader(layer, name)


def _head_scale_loader(head: nn.Module, name: str):
    """The full [vocab] (or [vocab, 1]) scale -> this rank's vocab rows; padding rows stay 0."""

    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if shard_id is not None:
            raise ValueError(f"{name}.weight_scale takes no shard_id, got {shard_id!r}")
        loaded = loaded.float().reshape(-1, 1)
        if loaded.shape[0] != head.num_embeddings:
            raise ValueError(
                f"{name}.weight_scale: expected {head.num_embeddings} rows (the vocabulary), got {loaded.shape[0]}"
            )
        start = min(head.vocab_start_index, head.num_embeddings)
        end = min(head.vocab_end_index, head.num_embeddings)
        param.data.zero_()
        param.data[: end - start].copy_(loaded[start:end])

    return load
