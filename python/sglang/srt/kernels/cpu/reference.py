"""Torch references of the CPU kernels (same signatures); the tests compare the two."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def decode_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    slots: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [n, H, D]; k/v_buf [Hk, rows, D]; slots [n, max_len] pool rows (valid up to lens[i])."""
    outs = []
    group = q.shape[1] // k_buf.shape[0]
    for i in range(q.shape[0]):
        rows = slots[i, : int(lens[i])]
        k = k_buf[:, rows].float().repeat_interleave(group, dim=0)  # [H, L, D]
        v = v_buf[:, rows].float().repeat_interleave(group, dim=0)
        p = torch.softmax(torch.einsum("hd,hld->hl", q[i].float() * scale, k), dim=-1)
        outs.append(torch.einsum("hl,hld->hd", p, v))
    return torch.stack(outs).to(q.dtype)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float) -> list[torch.Tensor]:
    """A float32 residual under a bf16 x (a float32 residual stream) stays float32; the normed
    output is in x's dtype."""
    res = x + residual
    return [rms_norm(res, w, eps).to(x.dtype), res]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    xf = x.float()
    return (F.silu(xf[..., :d]) * xf[..., d:]).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int) -> torch.Tensor:
    """x [T, H, D]; cos / sin [T, rot] with sin's first half negated (RotaryEmbedding's tables)."""
    xf = x.float()
    r = xf[..., :rot]
    r = r * cos.float()[:, None] + r.roll(rot // 2, dims=-1) * sin.float()[:, None]
    return torch.cat((r, xf[..., rot:]), dim=-1).to(x.dtype)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    k_cache: Optional[torch.Tensor] = None,
    v_cache: Optional[torch.Tensor] = None,
    prefix_slots: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Causal attention of n new tokens: q [n, H, D], k / v [n, Hk, D], after an optional cached
    prefix (rows prefix_slots of head-major k/v_cache [Hk, rows, D]) -> [n, H, D] (written into
    `out` and returned when given)."""
    keys, values = k.transpose(0, 1), v.transpose(0, 1)  # [Hk, n, D]
    prefix = 0
    if prefix_slots is not None and prefix_slots.numel():
        prefix = prefix_slots.numel()
        keys = torch.cat((k_cache[:, prefix_slots], keys), dim=1)
        values = torch.cat((v_cache[:, prefix_slots], values), dim=1)
    n = q.shape[0]
    mask = torch.ones(n, prefix + n, dtype=torch.bool).tril(diagonal=prefix)
    res = (
        F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0).float(),
            keys.unsqueeze(0).float(),
            values.unsqueeze(0).float(),
            attn_mask=mask,
            scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )[0]
        .transpose(0, 1)
        .to(q.dtype)
    )
    if out is None:
        return res
    out.copy_(res)
    return out


def linear_f32out_packed(
    x: torch.Tensor, packed: torch.Tensor, N: int, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """float32 x [n, K] . W^T (+ bias) in float32, W [N, K] bf16 rebuilt from its packed form
    (int32 [ceil(N / 32), K, 16]: row 32b + l in the low half of lane l, row 32b + 16 + l in the high half)."""
    blocks, K, _ = packed.shape
    lo = (packed << 16).view(torch.float32)  # [blocks, K, 16]: rows 32b + l
    hi = (packed & -65536).view(torch.float32)  # rows 32b + 16 + l
    w = torch.stack([lo, hi], dim=1).permute(0, 1, 3, 2).reshape(blocks * 32, K)[:N]
    return F.linear(x.float(), w, None if bias is None else bias.float())


def bf16_linear(
    x: torch.Tensor, packed: torch.Tensor, N: int, bias: Optional[torch.Tensor] = None, use_amx: bool = True
) -> torch.Tensor:
    """bf16 x [M, K] . W^T (+ bias) summed in float32, rounded to bf16 once; W [N, K] rebuilt from
    its packed form (int32 [ceil(N / 16), Kp / 2, 16]: column 16b + l's k = 2p in the low half of
    (b, p, l), k = 2p + 1 in the high half). `use_amx` changes only the kernel's path."""
    w = _unpack_kpairs(packed, N, x.shape[1])
    out = F.linear(x.float(), w, None if bias is None else bias.float())
    return out.to(torch.bfloat16)


def bf16_linear_f32out(
    x: torch.Tensor, packed: torch.Tensor, N: int, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """float32 x [M, K] . W^T (+ float32 bias) in float32, W bf16 from pack_bf16_kpairs' layout (as
    bf16_linear's reference)."""
    return F.linear(x.float(), _unpack_kpairs(packed, N, x.shape[1]), bias)


def _unpack_kpairs(packed: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """W [N, K] as float32 from pack_bf16_kpairs' int32 [ceil(N / 16), Kp / 2, 16]."""
    blocks, pairs, _ = packed.shape
    lo = (packed << 16).view(torch.float32)  # [blocks, pairs, 16]: k = 2p
    hi = (packed & -65536).view(torch.float32)  # k = 2p + 1
    return torch.stack([lo, hi], dim=2).permute(0, 3, 1, 2).reshape(blocks * 16, pairs * 2)[:N, :K]
