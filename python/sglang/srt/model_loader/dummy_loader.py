"""Deterministic random ("dummy") weights for runs without a checkpoint.

Each parameter gets its own CPU generator seeded from (`seed`, parameter name), so values depend only
on the seed, the name and the shape: not on dtype, device, or which other parameters the module holds
(a pipeline stage holding layers 15..29 gets the same values as the full model's layers 15..29).
Values are drawn in float32 and then cast.

- 1-D parameters whose name contains "norm" (RMSNorm / LayerNorm weights): 1.0 (biases of norms: 0.0).
- everything else (matrices, embeddings, biases): normal(0, std), default std 0.02.

NOTE: a tensor-parallel shard gets values drawn for its own shard shape, so dummy weights are not
consistent across different TP sizes; use real or `write_random_checkpoint` weights for TP parity tests.
"""

from __future__ import annotations

import zlib

import torch


def _param_seed(seed: int, name: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode("utf-8"))) % (2**63 - 1)


def _is_norm(name: str, param: torch.Tensor) -> bool:
    return param.dim() == 1 and "norm" in name.rsplit(".", 1)[0].lower()


@torch.no_grad()
def init_dummy_weights(model: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Fill every parameter of `model` in place with deterministic values (see module docstring)."""
    for name, param in model.named_parameters():
        if _is_norm(name, param):
            param.fill_(0.0 if name.endswith("bias") else 1.0)
            continue
        gen = torch.Generator(device="cpu").manual_seed(_param_seed(seed, name))
        values = torch.empty(param.shape, dtype=torch.float32).normal_(0.0, std, generator=gen)
        param.copy_(values.to(device=param.device, dtype=param.dtype))
