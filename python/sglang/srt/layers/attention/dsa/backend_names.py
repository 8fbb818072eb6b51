"""Values of `--nsa-prefill-backend` / `--nsa-decode-backend` (aliases `--dsa-prefill-backend` /
`--dsa-decode-backend`): which implementation of the DSA ops (`sgl_kernel_npu`) the `dsa`
attention backend runs for prefill (extend / mixed batches) and for decode batches.

Ours: `auto` (the device platform's choice: `Platform.dsa_ops_impl`), `reference` (torch),
`cpu` (fused C++ kernels), `triton`, `torch_npu` (CANN's fused ops). Upstream SGLang's names are
accepted where they map: its CUDA kernel families (`flashmla_sparse`, `flashmla_kv`,
`flashmla_auto`, `fa3`, `tilelang`, `aiter`, `trtllm`) all name a GPU implementation of the same
sparse MLA op, which here is the Triton one; `ascend` names the torch_npu ops. Imports nothing heavy
(ServerArgs.validate reads it).
"""

from __future__ import annotations

from typing import Optional

OUR_IMPLS = ("auto", "reference", "cpu", "triton", "torch_npu")
UPSTREAM_ALIASES = {
    "flashmla_sparse": "triton",
    "flashmla_kv": "triton",
    "flashmla_auto": "triton",
    "fa3": "triton",
    "tilelang": "triton",
    "aiter": "triton",
    "trtllm": "triton",
    "ascend": "torch_npu",
}
# attention backend names that run the DSA ops (the others use the torch reference for DSA)
DSA_ATTENTION_BACKENDS = ("dsa", "nsa")


# the Lightning Indexer's scoring precision on the `dsa` backend (env SGLANG_DSA_INDEX_SCORE_DTYPE;
# a server flag would carry the same values): "auto" = the index-key cache's dtype (a float32
# model scores in float32, exactly the reference's scores; a bf16 model's cache is bf16 already),
# "bfloat16" = query and keys rounded to bf16, exact products summed in float32 (DeepSeek's own
# indexer scores in FP8), "int8" = query heads and keys quantized per row to symmetric int8,
# exact integer dot products (vpdpbusd where the CPU has VNNI: ~2x the float32 indexer), "float32"
# = the values as stored, in float32.
INDEX_SCORE_DTYPES = ("auto", "float32", "bfloat16", "int8")
INDEX_SCORE_DTYPE_ENV = "SGLANG_DSA_INDEX_SCORE_DTYPE"


def _index_score_setting(value: Optional[str]) -> str:
    """`value`, by default $SGLANG_DSA_INDEX_SCORE_DTYPE (srt/envs.py), checked."""
    if value is None:
        from sglang.srt import envs

        value = envs.SGLANG_DSA_INDEX_SCORE_DTYPE.get()
    if value not in INDEX_SCORE_DTYPES:
        raise ValueError(f"{INDEX_SCORE_DTYPE_ENV}={value!r}; choices: {INDEX_SCORE_DTYPES}")
    return value


def index_score_dtype(cache_dtype, value: Optional[str] = None):
    """The torch dtype the `dsa` backend scores the indexer in (None = float32 on the stored values)
    for an index-key cache of `cache_dtype`; `value` defaults to $SGLANG_DSA_INDEX_SCORE_DTYPE."""
    import torch

    value = _index_score_setting(value)
    if value == "bfloat16" or (value == "auto" and cache_dtype == torch.bfloat16):
        return torch.bfloat16
    if value == "int8":
        return torch.int8
    return None


def int8_index_keys(value: Optional[str] = None) -> bool:
    """Whether the DSA pool keeps an int8 copy of the index keys (quantized once, when written) for
    the `dsa` backend's int8 scoring: $SGLANG_DSA_INDEX_SCORE_DTYPE is "int8"."""
    return _index_score_setting(value) == "int8"


def nsa_backend_choices() -> list[str]:
    return list(OUR_IMPLS) + sorted(UPSTREAM_ALIASES)


def resolve_nsa_backend(name: Optional[str]) -> str:
    """Our implementation name for a flag value (None -> "auto"); ValueError for an unknown one."""
    if name is None:
        return "auto"
    if name in OUR_IMPLS:
        return name
    if name in UPSTREAM_ALIASES:
        return UPSTREAM_ALIASES[name]
    raise ValueError(f"unknown DSA op backend {name!r}; choices: {nsa_backend_choices()}")
