"""Pure attention math: the leaf of `layers/attention` (imports only torch, `platforms.kernel_dispatch`
and, where installed, `sgl_kernel_npu`, whose merge_attn_states is the one LSE merge).

- `mask.causal_mask`: bool mask by absolute position;
- `lse.attention_with_lse` (exact float32 math) and `lse.sdpa_lse` (torch's CPU flash kernel with
  LSE, exact-math fallback elsewhere): attention returning the log-sum-exp of its scores;
- `merge.merge_state`: the one merge of partial attentions over disjoint key sets;
- `causal.causal_attention_lse` (queries at arbitrary positions, blocked) and
  `causal.attend_prefix_and_chunk` (a chunk over its cached prefix).
"""

from sglang.srt.layers.attention.ops.mask import causal_mask
from sglang.srt.layers.attention.ops.lse import attention_with_lse, lse_kernel_available, sdpa_lse
from sglang.srt.layers.attention.ops.merge import merge_state
from sglang.srt.layers.attention.ops.causal import (
    attend_prefix_and_chunk,
    causal_attention_lse,
    contiguous_runs,
)

__all__ = [
    "attend_prefix_and_chunk",
    "attention_with_lse",
    "causal_attention_lse",
    "causal_mask",
    "contiguous_runs",
    "lse_kernel_available",
    "merge_state",
    "sdpa_lse",
]
