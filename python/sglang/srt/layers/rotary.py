"""Rotary position embedding (neox / HF-Llama "rotate_half" layout) with a precomputed cache.

Supported `rope_type`s: default, linear, llama3. The cos/sin tables are computed once in float32
for positions [0, max_position) and kept in the compute dtype. A model gathers them once per
forward (`cos_sin(positions)`) and every layer reuses the result through `apply`.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn

from sglang.srt.platforms.kernel_dispatch import fused_ops

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def get_rope_params(hf_config: Any) -> tuple[float, Optional[dict]]:
    """(rope_theta, scaling dict or None) from an HF config, old (`rope_theta`/`rope_scaling`) or
    new (`rope_parameters`) style."""
    params = getattr(hf_config, "rope_parameters", None)
    scaling = getattr(hf_config, "rope_scaling", None)
    theta = getattr(hf_config, "rope_theta", None)
    merged: dict = {}
    for src in (scaling, params):
        if isinstance(src, dict):
            merged.update(src)
    if theta is None:
        theta = merged.get("rope_theta", 10000.0)
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    merged["rope_type"] = rope_type
    return float(theta), merged


def building_on_meta() -> bool:
    """True while a model is built on the "meta" device (shapes only:
    `models/checkpoint_specs.derive_weight_specs`). The RoPE tables are then left empty: their
    arithmetic on meta tensors would run torch's Python meta kernels, whose first use imports
    torch._dynamo (~1.5 CPU-s per rank process at start-up)."""
    return torch.get_default_device().type == "meta"


def compute_inv_freq(rotary_dim: int, base: float, scaling: Optional[dict] = None) -> torch.Tensor:
    """Inverse frequencies [rotary_dim // 2] in float32, with optional linear / llama3 scaling."""
    if building_on_meta():
        return torch.empty(rotary_dim // 2, dtype=torch.float32)
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    if scaling is None:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope_type {rope_type!r}; supported: {list(SUPPORTED_ROPE_TYPES)}")


class RotaryEmbedding(nn.Module):
    """Applies RoPE to the first `rotary_dim` dims of each head (all of them by default)."""

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        base: float = 10000.0,
        rope_scaling: Optional[dict] = None,
        rotary_dim: Optional[int] = None,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if self.rotary_dim % 2 or self.rotary_dim > head_dim:
            raise ValueError(f"rotary_dim ({self.rotary_dim}) must be even and <= head_dim ({head_dim})")
        self.base = base
        self.rope_scaling = rope_scaling
        self.dtype = dtype
        self.register_buffer(
            "inv_freq", compute_inv_freq(self.rotary_dim, base, rope_scaling), persistent=False
        )
        self.max_position = 0
        self.extend_cache(max_position)

    def extend_cache(self, max_position: int) -> None:
        """(Re)build the cos/sin tables so that positions < max_position are valid."""
        if max_position <= self.max_position:
            return
        if self.inv_freq.is_meta:  # shapes only (building_on_meta)
            for name in ("cos_cache", "sin_cache"):
                self.register_buffer(
                    name, torch.empty(max_position, self.rotary_dim, dtype=self.dtype), False
                )
            self.max_position = max_position
            return
        pos = torch.arange(max_position, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]  # [P, rot/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        half = self.rotary_dim // 2
        sin = emb.sin()
        # sin with the first half negated: rotate_half(x) * sin == roll(x, half) * sin_signed
        sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        self.register_buffer("cos_cache", emb.cos().to(self.dtype), persistent=False)
        self.register_buffer("sin_cache", sin_signed.to(self.dtype), persistent=False)
        self.max_position = max_position

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin of each position, [num_tokens, 1, rotary_dim] (broadcast over heads)."""
        return self.cos_cache[positions].unsqueeze(1), self.sin_cache[positions].unsqueeze(1)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate x [num_tokens, num_heads, head_dim] with tables from `cos_sin`."""
        if x.dim() == 3 and x.stride(-1) == 1 and cos.dim() == 3 and cos.dtype == x.dtype == sin.dtype:
            ops = fused_ops(x)
            if ops is not None:
                return ops.rope(x, cos.squeeze(1), sin.squeeze(1), self.rotary_dim)
        if self.rotary_dim == self.head_dim:
            return torch.addcmul(x * cos, x.roll(self.rotary_dim // 2, dims=-1), sin)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        rot = torch.addcmul(rot * cos, rot.roll(self.rotary_dim // 2, dims=-1), sin)
        return torch.cat((rot, rest), dim=-1)

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate query / key of shape [num_tokens, heads * head_dim] or [num_tokens, heads, head_dim]."""
        cos, sin = self.cos_sin(positions)
        n = positions.shape[0]
        q = self.apply(query.reshape(n, -1, self.head_dim), cos, sin).reshape(query.shape)
        k = self.apply(key.reshape(n, -1, self.head_dim), cos, sin).reshape(key.shape)
        return q, k

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, max_pos={self.max_position}"


def get_rope(
    hf_config: Any, head_dim: int, dtype: torch.dtype, max_position: Optional[int] = None
) -> RotaryEmbedding:
    """A RotaryEmbedding configured from an HF config (theta, scaling, partial rotary factor)."""
    theta, scaling = get_rope_params(hf_config)
    params = getattr(hf_config, "rope_parameters", None)
    partial = getattr(hf_config, "partial_rotary_factor", None) or 1.0
    if isinstance(params, dict) and params.get("partial_rotary_factor") is not None:
        partial = params["partial_rotary_factor"]
    if max_position is None:
        max_position = int(getattr(hf_config, "max_position_embeddings", 2048) or 2048)
    return RotaryEmbedding(
        head_dim,
        max_position,
        base=theta,
        rope_scaling=scaling,
        rotary_dim=int(head_dim * partial),
        dtype=dtype,
    )
