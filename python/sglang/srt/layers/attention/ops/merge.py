"""The one merge of partial attentions over disjoint key sets, by their log-sum-exp.

The implementation lives in `sgl_kernel_npu.merge_attn_states` (torch reference, fused CPU kernel,
Triton), shared with the DSA ops; context parallelism and split attention (prefix + chunk, long
decode runs) call it through `merge_state`. sgl-kernel-npu is optional (it is not on PyPI): without
it the same math runs in torch here (`merge_state_torch`).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import torch


@functools.lru_cache(maxsize=1)
def _kernel_merge() -> Optional[Callable]:
    """sgl_kernel_npu's merge, or None where the package is not installed (looked up once)."""
    try:
        from sgl_kernel_npu import merge_attn_states
    except ImportError:
        return None
    return merge_attn_states


def merge_state(
    outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine partial attentions of the same queries over disjoint key sets.

    outs[r] [..., L, D], lses[r] [..., L] (float32; -inf for a query that saw no key of part r).
    With m = max_r lse_r, w_r = exp(lse_r - m) and W = sum_r w_r: lse = m + log W and
    out = sum_r (w_r / W) * out_r, accumulated in float32. A query with no key in any part gets
    out = 0 and lse = -inf. Returns (out in outs[0]'s dtype, lse float32). outs[0] may be used as
    the accumulator (overwritten) when it is float32: pass partials that are not needed afterwards.
    The implementation is the device's (`sgl_kernel_npu`: the fused CPU kernel on CPU), or torch.
    """
    kernel = _kernel_merge()
    return kernel(outs, lses) if kernel is not None else merge_state_torch(outs, lses)


def merge_state_torch(
    outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """`merge_state` in torch ops (any device; new tensors only), for installs without sgl-kernel-npu."""
    stacked = torch.stack([x.float() for x in lses])  # [R, ..., L]
    top = stacked.amax(0)
    top = top.masked_fill(torch.isinf(top), 0.0)  # every part -inf: weights 0, lse -inf below
    weight = (stacked - top).exp()
    total = weight.sum(0)
    out = sum(o.float() * w.unsqueeze(-1) for o, w in zip(outs, weight.unbind(0)))
    out = out / total.masked_fill(total == 0, 1.0).unsqueeze(-1)
    return out.to(outs[0].dtype), top + total.log()
