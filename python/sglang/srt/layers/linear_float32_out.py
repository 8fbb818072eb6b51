"""Linear with float32 output whatever the weight dtype: the LM head at float32 precision
(`--enable-fp32-lm-head`, the default on CPU; `--disable-fp32-lm-head` turns it off there).

A bf16 model's LM head otherwise returns bf16 logits: at logit magnitudes of 16-32 bf16 keeps
steps of 0.125, so two candidate tokens a tenth of a logprob apart can come out tied and the tie
goes to the lower token id (the default model's answer to `make demo` on AVX-512 CPUs without BF16
changed that way). Here the hidden states are taken in float32, the products accumulated in float32
and the logits returned in float32; bf16 weights are widened exactly (no float32 copy is kept).

- CPU, up to `KERNEL_MAX_ROWS` rows (decode steps, the last rows of prefills): the fused kernel
  `linear_f32out` (kernels/cpu/csrc/linear_f32out.cpp) reads each weight row once for all rows, so
  it costs the bytes of a bf16 GEMM.
- Otherwise (many rows: prompt logprobs; devices without the kernel): blocks of `BLOCK_ROWS`
  weight rows are widened to float32 and multiplied, so memory stays bounded.
A float32 weight is used as it is (a float32 model's bf16 weight copies are not used for logits).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sglang.srt.kernels.dispatch import fused_ops

KERNEL_MAX_ROWS = 32
BLOCK_ROWS = 8192


def float32_out_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [..., K] . weight [N, K]^T (+ bias) -> [..., N] float32."""
    x2 = x.reshape(-1, x.shape[-1])
    bias32 = None if bias is None else bias.float()
    n = x2.shape[0]
    if weight.dtype == torch.float32:
        out = F.linear(x2.float(), weight, bias32)
    else:
        ops = fused_ops(weight)
        kernel = getattr(ops, "linear_f32out", None) if ops is not None else None
        if kernel is not None and 0 < n <= KERNEL_MAX_ROWS and weight.stride(-1) == 1:
            out = kernel(x2.contiguous(), weight, bias32)
        else:
            out = _blocked(x2.float(), weight, bias32)
    return out.view(*x.shape[:-1], weight.shape[0])


def _blocked(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32, device=x.device)
    for start in range(0, weight.shape[0], BLOCK_ROWS):
        end = min(start + BLOCK_ROWS, weight.shape[0])
        out[:, start:end] = F.linear(x, weight[start:end].float(), None if bias is None else bias[start:end])
    return out


def use_float32_logits(model: torch.nn.Module, server_args, platform) -> bool:
    """Switch every LM head of `model` (the modules with a `float32_logits` switch:
    vocab_embedding.ParallelLMHead) to float32 logits where the flags / platform ask for it;
    returns whether they did."""
    on = server_args.enable_fp32_lm_head or (platform.float32_logits_by_default and not server_args.disable_fp32_lm_head)
    for module in model.modules():
        if hasattr(module, "float32_logits"):
            module.float32_logits = on
    return on
