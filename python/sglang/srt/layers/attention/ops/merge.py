"""The one merge of partial attentions over disjoint key sets, by their log-sum-exp."""

from __future__ import annotations

from typing import Sequence

import torch


def merge_state(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine partial attentions of the same queries over disjoint key sets.

    outs[r] [..., L, D], lses[r] [..., L] (float32; -inf for a query that saw no key of part r).
    With m = max_r lse_r, w_r = exp(lse_r - m) and W = sum_r w_r: lse = m + log W and
    out = sum_r (w_r / W) * out_r, accumulated in float32. A query with no key in any part gets
    out = 0 and lse = -inf. Two parts (the hot case: prefix + chunk, a decode's runs) take no
    stacking: it is the same sum, written out.

    Returns (out in outs[0]'s dtype, lse float32). When outs[0] is already float32 it is used as
    the accumulator (overwritten): pass partials that are not needed afterwards.
    """
    m = lses[0]
    for lse_r in lses[1:]:
        m = torch.maximum(m, lse_r)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    weights = [torch.exp(lse_r - m) for lse_r in lses]
    total = weights[0]
    for w in weights[1:]:
        total = total + w
    lse = m + torch.log(total)
    total = torch.where(total == 0, torch.ones_like(total), total)
    out = outs[0].float().mul_((weights[0] / total).unsqueeze(-1))
    for o, w in zip(outs[1:], weights[1:]):
        out.addcmul_(o.float(), (w / total).unsqueeze(-1))
    return out.to(outs[0].dtype), lse
