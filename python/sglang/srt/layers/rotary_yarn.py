"""DeepSeek rotary embedding: YaRN frequencies, the attention factor, and DeepSeek's two rope layouts.

- `rope_frequencies(...)`: inverse frequencies + the cos/sin multiplier ("attention factor") for the
  default, linear, llama3 and yarn rope types (yarn as in the YaRN paper / HF `_compute_yarn_parameters`).
- `mla_softmax_scale(...)`: `qk_head_dim^-0.5`, times `mscale(factor, mscale_all_dim)^2` under YaRN —
  the softmax correction DeepSeek applies on top of the rope attention factor.
- `DeepseekRotaryEmbedding`: half-size cos/sin tables (one angle per rotated pair) and two ways to
  rotate: `apply_interleaved` (MLA: pairs (x0, x1), (x2, x3)...; the output is laid out as
  [rotated evens ; rotated odds], like HF, which only permutes q and k identically) and
  `apply_neox` (the V3.2 Lightning Indexer: pairs (x_i, x_{i + d/2})).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn

from sglang.srt.layers.rotary import building_on_meta, compute_inv_freq, get_rope_params


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """YaRN magnitude correction `0.1 * mscale * ln(scale) + 1` (1 when scale <= 1)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(
    dim: int, base: float, scaling: dict, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    factor = scaling.get("factor")
    original = scaling.get("original_max_position_embeddings") or max_position_embeddings
    if factor is None:
        factor = max_position_embeddings / original
    factor = float(factor)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor)
    if building_on_meta():  # shapes only (rotary.building_on_meta)
        return torch.empty(dim // 2, dtype=torch.float32), float(attention_factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1: keep the original (extrapolated) frequency
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


def rope_frequencies(
    rotary_dim: int, base: float, scaling: Optional[dict], max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """(inv_freq [rotary_dim // 2] float32, attention factor multiplying cos and sin)."""
    rope_type = "default" if scaling is None else scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "yarn":
        return _yarn_inv_freq(rotary_dim, base, scaling, max_position_embeddings)
    return compute_inv_freq(rotary_dim, base, None if rope_type == "default" else scaling), 1.0


def mla_softmax_scale(qk_head_dim: int, hf_config: Any) -> float:
    """Softmax scale of MLA: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 when rope is scaled."""
    scale = qk_head_dim**-0.5
    _, scaling = get_rope_params(hf_config)
    if scaling is not None:
        mscale_all_dim = scaling.get("mscale_all_dim", 0)
        if mscale_all_dim and scaling.get("factor"):
            m = yarn_get_mscale(float(scaling["factor"]), float(mscale_all_dim))
            scale = scale * m * m
    return scale


class DeepseekRotaryEmbedding(nn.Module):
    """Precomputed half tables: cos/sin [max_position, rotary_dim // 2], already times the attention factor."""

    def __init__(
        self,
        rotary_dim: int,
        max_position: int,
        base: float = 10000.0,
        rope_scaling: Optional[dict] = None,
        max_position_embeddings: Optional[int] = None,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        if rotary_dim % 2:
            raise ValueError(f"rotary_dim ({rotary_dim}) must be even")
        self.rotary_dim = rotary_dim
        self.dtype = dtype
        inv_freq, self.attention_factor = rope_frequencies(
            rotary_dim, base, rope_scaling, max_position_embeddings or max_position
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.max_position = 0
        self.extend_cache(max_position)

    @staticmethod
    def from_config(hf_config: Any, rotary_dim: int, dtype: torch.dtype) -> "DeepseekRotaryEmbedding":
        theta, scaling = get_rope_params(hf_config)
        max_pos = int(getattr(hf_config, "max_position_embeddings", 4096) or 4096)
        return DeepseekRotaryEmbedding(rotary_dim, max_pos, theta, scaling, max_pos, dtype)

    def extend_cache(self, max_position: int) -> None:
        if max_position <= self.max_position:
            return
        if self.inv_freq.is_meta:  # shapes only (rotary.building_on_meta)
            half = self.rotary_dim // 2
            for name in ("cos_cache", "sin_cache"):
                self.register_buffer(name, torch.empty(max_position, half, dtype=self.dtype), False)
            self.max_position = max_position
            return
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        self.register_buffer(
            "cos_cache", (freqs.cos() * self.attention_factor).to(self.dtype), persistent=False
        )
        self.register_buffer(
            "sin_cache", (freqs.sin() * self.attention_factor).to(self.dtype), persistent=False
        )
        self.max_position = max_position

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of each position: [num_tokens, 1, rotary_dim // 2] (broadcast over heads)."""
        return self.cos_cache[positions].unsqueeze(1), self.sin_cache[positions].unsqueeze(1)

    @staticmethod
    def apply_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate pairs (x[2i], x[2i+1]); x [n, heads, rotary_dim] -> [rotated evens ; rotated odds]."""
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    @staticmethod
    def apply_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate pairs (x[i], x[i + d/2]); x [n, heads, rotary_dim]."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, max_pos={self.max_position}, attn_factor={self.attention_factor:.4g}"
