"""Linear with float32 output whatever the weight dtype: the LM head at float32 precision
(`--enable-fp32-lm-head`, the default on CPU; `--disable-fp32-lm-head` turns it off there).

A bf16 model's LM head otherwise returns bf16 logits: at logit magnitudes of 16-32 bf16 keeps
steps of 0.125, so two candidate tokens a tenth of a logprob apart can come out tied and the tie
goes to the lower token id (the default model's answer to `make demo` on AVX-512 CPUs without BF16
changed that way). Here the hidden states are taken in float32, the products summed in float32 and
the logits returned in float32; bf16 weights are widened exactly (no float32 copy is kept).

- CPU with the fused kernels: the bf16 weight is packed once after loading (the same bytes as the
  packed bf16 GEMM weight it replaces; `PackedHead`): on AMX `bf16_linear_f32out`
  (kernels/cpu/csrc/bf16_linear.cpp: x split exactly into three bf16 planes on AMX tiles, products
  exact, sums in float32; the weight read once per call whatever the rows), elsewhere
  `linear_f32out_packed` (kernels/cpu/csrc/linear_f32out_packed.cpp: the vocabulary along the
  vector lanes, float32 FMAs).
- Otherwise (other devices, no kernels): blocks of `BLOCK_ROWS` weight rows are widened to float32
  and multiplied, so memory stays bounded.
A float32 weight is used as it is (a float32 model's bf16 weight copies are not used for logits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers.linear_bf16_packed import pack_bf16_kpairs
from sglang.srt.platforms.kernel_dispatch import amx_linear_kernels, fused_ops

BLOCK_ROWS = 8192
PACK_ROWS = 32  # weight rows per packed block (the kernel's two 16-lane halves)


def pack_bf16_pairs(weight: torch.Tensor) -> torch.Tensor:
    """bf16 [N, K] -> int32 [ceil(N / 32), K, 16]: lane l of block b at column k holds row 32b + l
    in its low 16 bits and row 32b + 16 + l in its high 16 bits (rows past N are zero)."""
    n, k = weight.shape
    blocks = -(-n // PACK_ROWS)
    padded = torch.zeros(blocks * PACK_ROWS, k, dtype=torch.bfloat16, device=weight.device)
    padded[:n] = weight
    bits = padded.view(torch.int16).to(torch.int32) & 0xFFFF
    halves = bits.view(blocks, 2, PACK_ROWS // 2, k)
    return ((halves[:, 1] << 16) | halves[:, 0]).transpose(1, 2).contiguous()


@dataclass(frozen=True)
class PackedHead:
    """A bf16 weight packed for one float32-output kernel: `run(x [n, K] float32, tensor, N, bias)`."""

    tensor: torch.Tensor
    run: Callable[..., torch.Tensor]

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()


def float32_out_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    packed: Optional[PackedHead] = None,
) -> torch.Tensor:
    """x [..., K] . weight [N, K]^T (+ bias) -> [..., N] float32; `packed`: float32_logits_packing(weight)
    where a CPU kernel serves it."""
    x2 = x.reshape(-1, x.shape[-1]).float()
    bias32 = None if bias is None else bias.float()
    if weight.dtype == torch.float32:
        out = F.linear(x2, weight, bias32)
    elif packed is not None and x2.shape[0] > 0:
        out = packed.run(x2.contiguous(), packed.tensor, weight.shape[0], bias32)
    else:
        out = _blocked(x2, weight, bias32)
    return out.view(*x.shape[:-1], weight.shape[0])


def _blocked(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32, device=x.device)
    for start in range(0, weight.shape[0], BLOCK_ROWS):
        end = min(start + BLOCK_ROWS, weight.shape[0])
        out[:, start:end] = F.linear(x, weight[start:end].float(), None if bias is None else bias[start:end])
    return out


def float32_logits_packing(weight: torch.Tensor) -> Optional[PackedHead]:
    """The weight packed for the CPU kernel that serves it here (AMX: `bf16_linear_f32out`, else
    `linear_f32out_packed`), or None where none does."""
    ops = fused_ops(weight)
    if weight.dtype != torch.bfloat16 or weight.dim() != 2 or ops is None:
        return None
    amx = amx_linear_kernels(weight.device)
    if amx is not None and hasattr(amx, "bf16_linear_f32out"):
        return PackedHead(pack_bf16_kpairs(weight.detach()), amx.bf16_linear_f32out)
    if not hasattr(ops, "linear_f32out_packed"):
        return None
    return PackedHead(pack_bf16_pairs(weight.detach()), ops.linear_f32out_packed)


def use_float32_logits(model: torch.nn.Module, server_args, platform) -> bool:
    """Switch every LM head of `model` (the modules with a `set_float32_logits` switch:
    vocab_embedding.ParallelLMHead) to float32 logits where the flags / platform ask for it;
    returns whether they did."""
    on = server_args.enable_fp32_lm_head or (
        platform.float32_logits_by_default and not server_args.disable_fp32_lm_head
    )
    if on:
        for module in model.modules():
            if hasattr(module, "set_float32_logits"):
                quantized = getattr(module, "quant_method", None) is not None  # its method packs it
                module.set_float32_logits(None if quantized else float32_logits_packing(module.weight))
    return on
