"""The torch_npu implementation: CANN's fused DSA ops (Ascend A3; CANN 8.5+ ships them in torch_npu).

Our signatures follow theirs, so the mapping is mostly pass-through; what it does:
- lengths and block tables become int32 tensors on the query's device (the ops take tensors);
- the indexer's weights are cast to the query's dtype (the op takes bf16 / fp16 weights like q);
- `score_dtype=torch.bfloat16`: query and key are handed to the op in bf16 (the op scores in its
  inputs' dtype);
- `npu_lightning_indexer` returns (indices, values): values are kept only for `return_value`;
- `npu_sparse_flash_attention` runs in MLA-absorb mode (`attention_mode=2`: one shared latent kv
  head, value = the latent key); with `return_softmax_lse` it returns (out, softmax_max,
  softmax_sum) and the natural-log LSE is max + log(sum), reshaped to the query's [.., N].

The op's own limits (index heads / dims it supports, block sizes multiple of 16, sparse_count <=
2048) are checked by CANN, not here. Tested against a stand-in module that records the calls
(test/kernels_npu/test_dsa_ops_npu_mapping.py): no NPU is available to us.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

import torch


def _torch_npu() -> Any:
    try:
        return importlib.import_module("torch_npu")
    except ImportError as e:
        raise ImportError("impl='torch_npu' needs torch_npu (CANN 8.5+) installed") from e


def _i32(x, device: torch.device) -> Optional[torch.Tensor]:
    if x is None:
        return None
    return torch.as_tensor(x).to(device=device, dtype=torch.int32)


def lightning_indexer(
    query,
    key,
    weights,
    actual_seq_lengths_query,
    actual_seq_lengths_key,
    block_table,
    layout_query,
    layout_key,
    sparse_count,
    sparse_mode,
    return_value,
    score_dtype=None,
):
    npu = _torch_npu()
    dev = query.device
    if score_dtype == torch.bfloat16:
        query, key = query.to(torch.bfloat16), key.to(torch.bfloat16)
    kwargs = dict(
        query=query,
        key=key,
        weights=weights.to(query.dtype),
        actual_seq_lengths_query=_i32(actual_seq_lengths_query, dev),
        actual_seq_lengths_key=_i32(actual_seq_lengths_key, dev),
        block_table=_i32(block_table, dev),
        layout_query=layout_query,
        layout_key=layout_key,
        sparse_count=int(sparse_count),
        sparse_mode=int(sparse_mode),
    )
    if return_value:
        kwargs["return_value"] = True
    result = npu.npu_lightning_indexer(**kwargs)
    indices, values = (result[0], result[1]) if isinstance(result, (tuple, list)) else (result, None)
    indices = indices.to(torch.int32)
    if return_value:
        return indices, values.float()
    return indices


def sparse_flash_attention(
    query,
    key,
    value,
    sparse_indices,
    scale_value,
    block_table,
    actual_seq_lengths_query,
    actual_seq_lengths_kv,
    query_rope,
    key_rope,
    sparse_block_size,
    layout_query,
    layout_kv,
    sparse_mode,
    return_softmax_lse,
):
    npu = _torch_npu()
    dev = query.device
    result = npu.npu_sparse_flash_attention(
        query=query,
        key=key,
        value=value,
        sparse_indices=sparse_indices.to(torch.int32),
        scale_value=float(scale_value),
        block_table=_i32(block_table, dev),
        actual_seq_lengths_query=_i32(actual_seq_lengths_query, dev),
        actual_seq_lengths_kv=_i32(actual_seq_lengths_kv, dev),
        query_rope=query_rope,
        key_rope=key_rope,
        sparse_block_size=int(sparse_block_size),
        layout_query=layout_query,
        layout_kv=layout_kv,
        sparse_mode=int(sparse_mode),
        attention_mode=2,
        return_softmax_lse=bool(return_softmax_lse),
    )
    if not return_softmax_lse:
        return result[0] if isinstance(result, (tuple, list)) else result
    out, smax, ssum = result[0], result[1], result[2]
    lse = (smax.float() + torch.log(ssum.float())).reshape(query.shape[:-1])
    return out, lse
