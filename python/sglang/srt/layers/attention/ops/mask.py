"""Causal masks by absolute position."""

from __future__ import annotations

import torch


def causal_mask(q_len: int, k_len: int, q_offset: int = 0, device=None) -> torch.Tensor:
    """Bool [q_len, k_len]: query j (absolute position q_offset + j) sees keys 0..q_offset + j."""
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + q_offset
    return torch.arange(k_len, device=device).unsqueeze(0) <= q_pos
