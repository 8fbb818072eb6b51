"""The one merge of partial attentions over disjoint key sets, by their log-sum-exp.

The implementation lives in `sgl_kernel_npu.merge_attn_states` (torch reference, fused CPU kernel,
Triton), shared with the DSA ops; context parallelism and split attention (prefix + chunk, long
decode runs) call it through `merge_state`.
"""

from __future__ import annotations

from typing import Sequence

import torch
from sgl_kernel_npu import merge_attn_states


def merge_state(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine partial attentions of the same queries over disjoint key sets.

    outs[r] [..., L, D], lses[r] [..., L] (float32; -inf for a query that saw no key of part r).
    With m = max_r lse_r, w_r = exp(lse_r - m) and W = sum_r w_r: lse = m + log W and
    out = sum_r (w_r / W) * out_r, accumulated in float32. A query with no key in any part gets
    out = 0 and lse = -inf. Returns (out in outs[0]'s dtype, lse float32). outs[0] may be used as
    the accumulator (overwritten) when it is float32: pass partials that are not needed afterwards.
    The implementation is the device's (`sgl_kernel_npu`: the fused CPU kernel on CPU).
    """
    return merge_attn_states(outs, lses)
