"""sgl_kernel_npu: DeepSeek Sparse Attention ops with one Python signature each and several
implementations behind it.

    lightning_indexer(query, key, weights, ...)            -> top-k key positions per query (int32)
    sparse_flash_attention(query, key, value, indices, ...) -> MLA attention over the selected rows (+ LSE)
    merge_attn_states(outputs, lses)                        -> partial attentions merged by their LSE

The signatures follow upstream's Ascend ops (`torch_npu.npu_lightning_indexer`,
`npu_sparse_flash_attention`: argument names, the TND / BSND / PA_BSND layouts, `sparse_mode` 0 / 3;
see `layouts.py`). `impl` picks the implementation:

- "reference": plain torch (`reference.py`), the oracle; any device;
- "cpu": fused C++ kernels (`cpu.py`, csrc/cpu; the ISA SGLang's selector picks: SGLANG_CPU_ISA or the best the CPU runs);
- "triton": Triton kernels (`triton_kernels.py`; CUDA, triton-ascend, or TRITON_INTERPRET=1 on CPU);
- "torch_npu": CANN's fused ops via torch_npu (`npu.py`);
- "auto" (default): by the tensors' device: cpu -> "cpu" when built (else "reference"), cuda ->
  "triton", npu -> "torch_npu".

FP8 rows (1 byte, widened where they are read): `lightning_indexer` takes float8_e4m3fn keys with
per-block scales (`key_scale`, DeepSeek-V3.2's index-key cache), `sparse_flash_attention`
float8_e4m3fn / float8_e5m2 latent rows with one `kv_scale` (an FP8 KV cache). The reference and the
CPU kernels read them as stored; for Triton and torch_npu the front widens them in torch first
(`_widen_for`: a float32 copy of the key tensor per call; a fallback, not a kernel).

Index order: the reference and Triton return the top-k by score (descending, ties to the earlier
position); the CPU kernel returns the same SET in its own order. Positions are within each
request's key sequence; -1 pads rows that see fewer than `sparse_count` keys.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from sgl_kernel_npu import reference
from sgl_kernel_npu.layouts import PagedKeys, Queries, canonical_keys, canonical_queries

IMPLS = ("auto", "reference", "cpu", "triton", "torch_npu")

__all__ = ["IMPLS", "lightning_indexer", "merge_attn_states", "resolve_impl", "sparse_flash_attention"]


def resolve_impl(impl: str, device: torch.device) -> str:
    """The concrete implementation `impl` means for tensors on `device`."""
    if impl not in IMPLS:
        raise ValueError(f"unknown DSA op implementation {impl!r}; choices: {IMPLS}")
    if impl != "auto":
        return impl
    if device.type == "cpu":
        from sgl_kernel_npu import cpu

        return "cpu" if cpu.available() else "reference"
    if device.type == "npu":
        return "torch_npu"
    return "triton"


def _backend(name: str):
    if name == "reference":
        return reference
    if name == "cpu":
        from sgl_kernel_npu import cpu

        return cpu
    if name == "triton":
        from sgl_kernel_npu import triton_kernels

        return triton_kernels
    raise ValueError(f"no canonical-form implementation {name!r}")


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
WIDEN_IN_TORCH = ("triton", "torch_npu")  # implementations whose kernels take no FP8 rows


def _widen_for(name: str, key: torch.Tensor, key_scale: Optional[torch.Tensor]):
    """TORCH FALLBACK for Triton / torch_npu: FP8 index keys widened to float32 (times their block
    scales) before the call; (key, key_scale) unchanged for the other implementations and dtypes."""
    if name not in WIDEN_IN_TORCH or key.dtype not in FP8_DTYPES or key_scale is None:
        return key, key_scale
    dim = key.shape[-1]
    wide = reference.widen_keys(key.reshape(-1, dim), key_scale.reshape(key.reshape(-1, dim).shape[0], -1))
    return wide.view(key.shape), None


def _index_score_dtype(
    key: torch.Tensor, key_scale: Optional[torch.Tensor], score_dtype: Optional[torch.dtype]
) -> Optional[torch.dtype]:
    """The scoring precision `lightning_indexer` runs (None: float32), its arguments checked."""
    if key.dtype == torch.int8 and score_dtype is None:
        score_dtype = torch.int8
    if score_dtype not in (None, torch.float32, torch.bfloat16, torch.int8):
        raise ValueError(
            f"score_dtype must be None, torch.float32, torch.bfloat16 or torch.int8, got {score_dtype}"
        )
    if key.dtype in FP8_DTYPES and (key.dtype != torch.float8_e4m3fn or key_scale is None):
        raise ValueError(
            f"FP8 index keys are float8_e4m3fn with key_scale (DeepSeek's format), got {key.dtype}"
            + ("" if key_scale is not None else " without key_scale")
        )
    if key.dtype == torch.int8 and score_dtype != torch.int8:
        raise ValueError(
            "an int8 key cache (key int8 + key_scale) is scored with score_dtype=torch.int8 only"
        )
    return None if score_dtype == torch.float32 else score_dtype


def _fp8_latent_rows(name: str, rows: tuple, kv_scale: float) -> tuple[tuple, float]:
    """sparse_flash_attention's (key, value, key_rope) checked: FP8 all alike or none (kv_scale
    then 1); for Triton / torch_npu (TORCH FALLBACK) FP8 rows widened here, float32 copies per call."""
    given = [t for t in rows if t is not None]
    fp8 = [t.dtype in FP8_DTYPES for t in given]
    if any(fp8) and not (all(fp8) and len({t.dtype for t in given}) == 1):
        raise ValueError(f"FP8 key / value / key_rope rows come together, got {[t.dtype for t in given]}")
    if not any(fp8) and kv_scale != 1.0:
        raise ValueError("kv_scale applies to FP8 rows only")
    if any(fp8) and name in WIDEN_IN_TORCH:
        return tuple(None if t is None else reference.widen_rows(t, kv_scale) for t in rows), 1.0
    return rows, kv_scale


def _check_indexer_shapes(query: torch.Tensor, weights: torch.Tensor, layout_query: str) -> None:
    want = query.shape[:-1]
    if tuple(weights.shape) != tuple(want):
        raise ValueError(
            f"weights must be {tuple(want)} (the query without its last dim), got {tuple(weights.shape)}"
        )


def lightning_indexer(
    query: torch.Tensor,
    key: torch.Tensor,
    weights: torch.Tensor,
    actual_seq_lengths_query=None,
    actual_seq_lengths_key=None,
    block_table: Optional[torch.Tensor] = None,
    layout_query: str = "BSND",
    layout_key: str = "BSND",
    sparse_count: int = 2048,
    sparse_mode: int = 3,
    *,
    return_value: bool = False,
    impl: str = "auto",
    score_dtype: Optional[torch.dtype] = None,
    key_scale: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Top-`sparse_count` key positions of every query: score[t, j] = sum_h relu(q[t, h] . k[j]) * w[t, h]
    (scales belong in `weights`), over the keys query t may see (`sparse_mode` 3: right-down causal).

    query [T, N, D] (TND) or [B, S, N, D] (BSND); key [T_k, 1, D] (TND), [B, S_k, 1, D] (BSND) or
    [num_blocks, block_size, 1, D] (PA_BSND, with block_table and actual_seq_lengths_key); weights
    the query's shape without D. Returns int32 indices [T, 1, K] / [B, S, 1, K] (-1 padded), and
    with `return_value` also their float32 scores (-inf padded).

    `score_dtype`: None scores the values as given in float32 (a bf16 query or key is widened
    exactly); torch.bfloat16 rounds query and keys to bf16 first (round to nearest even), then
    sums the (exact) products in float32: the precision of DeepSeek's narrow index scoring (the
    reference scores in FP8), at half the key bytes and, on CPUs with AVX512-BF16, twice the
    multiply rate. bf16 query and keys already are that case. torch.int8: each query head row and
    each key row quantized to symmetric int8 (`reference.quantize_int8`: scale amax / 127), the dot
    products exact integer sums, score = s_k * sum_h (w_h * s_qh) * relu(q8_h . k8) in float32
    (on CPUs with VNNI, twice the float32 multiply rate). An int8 index-key cache (`key` int8) comes
    with `key_scale`, one float32 scale per key row (key's shape without D), and scores in int8.
    The Triton path scores int8 on the dequantized keys (float32 products of the int8 values; the
    same up to float32 rounding); torch_npu refuses int8. float8_e4m3fn keys (an FP8 index-key
    cache) come with `key_scale`, one float32 scale per FP8_KEY_BLOCK (128) values of a row (key's
    shape with D replaced by the block count), and score at any `score_dtype` on their widened
    values (code x block scale, float32)."""
    score_dtype = _index_score_dtype(key, key_scale, score_dtype)
    if sparse_count < 1:
        raise ValueError(f"sparse_count must be >= 1, got {sparse_count}")
    _check_indexer_shapes(query, weights, layout_query)
    name = resolve_impl(impl, query.device)
    key, key_scale = _widen_for(name, key, key_scale)
    if name == "torch_npu":
        from sgl_kernel_npu import npu

        if score_dtype == torch.int8:
            raise NotImplementedError(
                "int8 index scoring is not mapped to torch_npu (use impl='reference' or 'cpu')"
            )
        return npu.lightning_indexer(
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
            score_dtype,
        )
    batch = (
        None if actual_seq_lengths_key is None else len(torch.as_tensor(actual_seq_lengths_key).reshape(-1))
    )
    keys = canonical_keys(key, layout_key, actual_seq_lengths_key, block_table, batch, key_scale)
    qs = canonical_queries(query, layout_query, keys.kv_lens, actual_seq_lengths_query, sparse_mode)
    w = weights.reshape(qs.q.shape[0], qs.q.shape[1])
    if name == "cpu":
        idx, val = _backend(name).indexer_topk(qs, w, keys, sparse_count, return_value, score_dtype)
    else:
        idx, val = _backend(name).indexer_topk(qs, w, keys, sparse_count, score_dtype=score_dtype)
    idx = qs.unflatten(idx.unsqueeze(1))
    return (idx, qs.unflatten(val.unsqueeze(1))) if return_value else idx


def sparse_flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sparse_indices: torch.Tensor,
    scale_value: float,
    block_table: Optional[torch.Tensor] = None,
    actual_seq_lengths_query=None,
    actual_seq_lengths_kv=None,
    query_rope: Optional[torch.Tensor] = None,
    key_rope: Optional[torch.Tensor] = None,
    sparse_block_size: int = 1,
    layout_query: str = "BSND",
    layout_kv: str = "BSND",
    sparse_mode: int = 3,
    *,
    return_softmax_lse: bool = False,
    impl: str = "auto",
    kv_scale: float = 1.0,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """MLA (absorbed) attention of every query over the key rows `sparse_indices` selects.

    query [T, N, Dk] / [B, S, N, Dk] (the latent part), query_rope the same with Dr; key, value and
    key_rope in `layout_kv` with one kv head (PA_BSND: [num_blocks, block_size, 1, dim] plus
    block_table and actual_seq_lengths_kv); the value may be the key itself (MLA: value = latent).
    sparse_indices [T, 1, K] / [B, S, 1, K] int32 positions in the request's key sequence, -1 =
    none; with `sparse_mode` 3 indices past a query's causal limit are ignored as well.
    scores = (q . k + q_rope . k_rope) * scale_value. Returns out [.., N, Dv] in query's dtype, and
    with `return_softmax_lse` the natural-log LSE [.., N] float32 (-inf, out 0: no valid index).
    key, value and key_rope may be FP8 (float8_e4m3fn / float8_e5m2, all alike: an FP8 latent
    cache), real value = code x `kv_scale`."""
    if sparse_block_size != 1:
        raise ValueError(f"only sparse_block_size 1 is implemented, got {sparse_block_size}")
    if (query_rope is None) != (key_rope is None):
        raise ValueError("query_rope and key_rope come together")
    name = resolve_impl(impl, query.device)
    (key, value, key_rope), kv_scale = _fp8_latent_rows(name, (key, value, key_rope), kv_scale)
    if name == "torch_npu":
        from sgl_kernel_npu import npu

        return npu.sparse_flash_attention(
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
        )
    keys = canonical_keys(key, layout_kv, actual_seq_lengths_kv, block_table)
    values = canonical_keys(value, layout_kv, actual_seq_lengths_kv, block_table).rows
    rope_rows = (
        None
        if key_rope is None
        else canonical_keys(key_rope, layout_kv, actual_seq_lengths_kv, block_table).rows
    )
    qs = canonical_queries(query, layout_query, keys.kv_lens, actual_seq_lengths_query, sparse_mode)
    n = qs.q.shape[0]
    qr = None if query_rope is None else query_rope.reshape(n, *query_rope.shape[-2:])
    idx = sparse_indices.reshape(n, sparse_indices.shape[-1])
    extra = (kv_scale,) if kv_scale != 1.0 else ()  # (FP8 rows: reference and cpu)
    out, lse = _backend(name).sparse_attention(
        qs.q, qr, keys, rope_rows, values, qs.batch, qs.kv_end, idx, scale_value, *extra
    )
    out = qs.unflatten(out)
    return (out, qs.unflatten(lse)) if return_softmax_lse else out


def merge_attn_states(
    outputs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor], *, impl: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial attentions of the same queries over disjoint key sets, merged by their log-sum-exp.

    outputs[r] [..., L, D], lses[r] [..., L] float32 (-inf: part r saw no key of that query).
    Returns (out in outputs[0]'s dtype, lse float32); a query no part saw gets out 0, lse -inf.
    The reference may overwrite a float32 outputs[0] (pass partials not needed afterwards)."""
    if len(outputs) != len(lses) or not outputs:
        raise ValueError("merge_attn_states needs as many outputs as lses (at least one)")
    name = resolve_impl(impl, outputs[0].device)
    if name == "torch_npu":  # CANN has no merge op of this form: the reference's torch ops run on the NPU
        name = "reference"
    return _backend(name).merge_attn_states(outputs, lses)


# the canonical types, for callers that build them directly
__all__ += ["PagedKeys", "Queries", "canonical_keys", "canonical_queries"]
