"""The int8 LM head's loading (`w8a8_head.py`): a tp rank's vocab rows of the int8 weight and of its
scale, padding rows zero, and a scale of the wrong size refused naming the tensor. (A tp group
stand-in gives the rank and size: no process group is needed to load.)"""

from __future__ import annotations

import types

import pytest
import torch

from sglang.srt.layers.quantization.w8a8_head import W8A8Int8HeadMethod
from sglang.srt.layers.quantization.w8a8_int8 import channel_quantize_int8
from sglang.srt.layers.vocab_embedding import ParallelLMHead

VOCAB, DIM = 37, 8


@pytest.mark.parametrize("rank", [0, 1])
def test_int8_head_loads_its_vocab_rows_and_scales(rank):
    head = ParallelLMHead(VOCAB, DIM, types.SimpleNamespace(rank=rank, size=2), torch.float32)
    W8A8Int8HeadMethod().create_weights(head, "lm_head")
    w, s = channel_quantize_int8(torch.randn(VOCAB, DIM, generator=torch.Generator().manual_seed(0)))
    head.weight.weight_loader(head.weight, w)
    head.weight_scale.weight_loader(head.weight_scale, s.reshape(-1))  # [vocab] as some checkpoints hold it
    rows = head.num_embeddings_per_partition  # 19: rank 1 holds 18 rows and one padding row
    lo, hi = rank * rows, min(VOCAB, (rank + 1) * rows)
    assert head.weight.dtype == torch.int8 and head.weight.shape == (rows, DIM)
    assert torch.equal(head.weight[: hi - lo], w[lo:hi]) and torch.equal(
        head.weight_scale[: hi - lo], s[lo:hi]
    )
    assert not head.weight[hi - lo :].any() and not head.weight_scale[hi - lo :].any()
    assert head.quant_method is not None and head.skip_prepack


def test_int8_head_scale_of_another_vocabulary_is_refused_by_name():
    head = ParallelLMHead(VOCAB, DIM, None, torch.float32)
    W8A8Int8HeadMethod().create_weights(head, "lm_head")
    with pytest.raises(ValueError, match=r"lm_head\.weight_scale: expected 37 rows"):
        head.weight_scale.weight_loader(head.weight_scale, torch.ones(VOCAB - 1, 1))
