"""Tensor-parallel linear layers.

Every parameter carries a `weight_loader(param, loaded_weight, shard_id=None)` that takes the FULL
(unsharded) checkpoint tensor and copies this rank's slice into the parameter, so the model loader
never needs to know how a layer is sharded. Weights are stored as [out_features, in_features].
The fused layers also say which checkpoint tensors a parameter is made of (`checkpoint_shape`), so
a model's checkpoint layout can be derived from the model itself (`models/checkpoint_specs.py`).

- ReplicatedLinear: no sharding.
- ColumnParallelLinear: output dim sharded; each rank returns its slice of the outputs.
- MergedColumnParallelLinear: several column-parallel outputs fused into one matmul (gate/up).
- QKVParallelLinear: q, k, v fused; KV heads are replicated when there are fewer KV heads than ranks.
- RowParallelLinear: input dim sharded; partial outputs summed with an all-reduce over the tp group
  (or returned unreduced, `reduce_results=False`, for a caller that sums them itself).
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import GroupCoordinator
from sglang.srt.layers.linear_prepack import linear

ShardId = Union[int, str, None]


def _divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what} ({numerator}) must be divisible by the tp size ({denominator})")
    return numerator // denominator


def _new_param(shape: tuple[int, ...], dtype: torch.dtype, loader) -> nn.Parameter:
    param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    param.weight_loader = loader  # type: ignore[attr-defined]
    return param


def _copy_checked(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(
            f"{name}: shape mismatch, parameter slice {tuple(dst.shape)} vs checkpoint {tuple(src.shape)}"
        )
    dst.copy_(src)


def _check_full(loaded: torch.Tensor, dim: int, expected: int, name: str) -> None:
    if loaded.dim() <= dim or loaded.shape[dim] != expected:
        raise ValueError(
            f"{name}: shape mismatch, checkpoint {tuple(loaded.shape)} needs size {expected} in dim {dim}"
        )


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: ShardId = None) -> None:
    """Copy a full tensor into an unsharded parameter (shapes must match)."""
    if shard_id is not None:
        raise ValueError(f"unsharded parameter got shard_id={shard_id!r}")
    _copy_checked(param.data, loaded_weight, "weight")


class LinearBase(nn.Module):
    """Holds `weight` [out_local, in_local] and an optional `bias` [out_local]."""

    def __init__(
        self,
        in_local: int,
        out_local: int,
        bias: bool,
        tp: Optional[GroupCoordinator],
        params_dtype: torch.dtype,
    ):
        super().__init__()
        self.tp = tp
        self.tp_rank = tp.rank if tp is not None else 0
        self.tp_size = tp.size if tp is not None else 1
        self.weight = _new_param((out_local, in_local), params_dtype, self.weight_loader)
        if bias:
            self.bias: Optional[nn.Parameter] = _new_param((out_local,), params_dtype, self.weight_loader)
        else:
            self.register_parameter("bias", None)
        self.packed_weight = None  # set once after loading where the platform packs weights
        self.quant_method = None  # e.g. layers/quantization Fp8BlockLinearMethod: it then multiplies

    def _matmul(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        if self.quant_method is not None:
            return self.quant_method.apply(self, x, bias)
        return linear(x, self.weight, bias, self.packed_weight)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the parameter dict read directly: `self.bias` goes through Module.__getattr__ (~1 us a call)
        return self._matmul(x, self._parameters["bias"])

    def extra_repr(self) -> str:
        return f"in={self.weight.shape[1]}, out={self.weight.shape[0]}, bias={self.bias is not None}, tp={self.tp_size}"


class ReplicatedLinear(LinearBase):
    """A plain linear layer, identical on every rank."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        tp: Optional[GroupCoordinator] = None,
        params_dtype: torch.dtype = torch.float32,
    ):
        super().__init__(input_size, output_size, bias, None, params_dtype)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        default_weight_loader(param, loaded_weight, shard_id)


class ColumnParallelLinear(LinearBase):
    """Y = X A^T with A's rows (outputs) split over tp ranks; `gather_output` all-gathers Y."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        tp: Optional[GroupCoordinator] = None,
        params_dtype: torch.dtype = torch.float32,
        gather_output: bool = False,
    ):
        tp_size = tp.size if tp is not None else 1
        self.output_size_per_partition = _divide(output_size, tp_size, "output size")
        super().__init__(input_size, self.output_size_per_partition, bias, tp, params_dtype)
        self.gather_output = gather_output

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        if shard_id is not None:
            raise ValueError(f"ColumnParallelLinear takes no shard_id, got {shard_id!r}")
        n = param.shape[0]
        _check_full(loaded_weight, 0, n * self.tp_size, "column-parallel")
        _copy_checked(param.data, loaded_weight.narrow(0, self.tp_rank * n, n), "column-parallel")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._matmul(x, self._parameters["bias"])
        if self.gather_output and self.tp_size > 1:
            out = self.tp.all_gather(out, dim=-1)
        return out


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input in one matmul (e.g. gate and up).

    Each rank's weight is [out_0/tp ; out_1/tp ; ...]; `shard_id` is the index of the projection.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: Sequence[int],
        bias: bool = False,
        tp: Optional[GroupCoordinator] = None,
        params_dtype: torch.dtype = torch.float32,
    ):
        tp_size = tp.size if tp is not None else 1
        self.output_sizes = list(output_sizes)
        self.local_sizes = [_divide(s, tp_size, f"output size {i}") for i, s in enumerate(self.output_sizes)]
        super().__init__(input_size, sum(self.output_sizes), bias, tp, params_dtype)

    def fused_swiglu(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """silu(gate) * up of a [gate; up] projection in one call, where the layer's kernel fuses the
        gate into its GEMM (the quant method's `apply_swiglu`: W8A8-INT8; the packed kernel's
        `swiglu`: bf16_linear on AMX); None where it does not (the caller then runs the layer and its
        SiluAndMul)."""
        if len(self.local_sizes) != 2 or self.local_sizes[0] != self.local_sizes[1]:
            return None
        if self.gather_output and self.tp_size > 1:
            return None
        bias = self._parameters["bias"]  # not `self.bias`: Module.__getattr__ costs ~1 us a call
        if self.quant_method is not None:
            fused = getattr(self.quant_method, "apply_swiglu", None)
            return fused(self, x, bias) if fused is not None else None
        if self.packed_weight is None or x.dtype != self._parameters["weight"].dtype:
            return None
        packed, kernel = self.packed_weight
        fused = getattr(kernel, "swiglu", None)
        if fused is None:
            return None
        if x.dim() == 2 and x.is_contiguous():
            return fused(x, packed, bias)
        out = fused(x.reshape(-1, x.shape[-1]), packed, bias)
        return out.view(*x.shape[:-1], out.shape[-1]) if out is not None else None

    def checkpoint_shape(self, shard_id: ShardId, param: nn.Parameter) -> tuple[int, ...]:
        """FULL shape of the checkpoint tensor that `weight_loader(param, tensor, shard_id)` takes."""
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"shard_id must be in 0..{len(self.output_sizes) - 1}, got {shard_id!r}")
        return (self.output_sizes[shard_id], *param.shape[1:])

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        if shard_id is None:  # an already fused checkpoint tensor: split it and load each part
            for i, part in enumerate(torch.split(loaded_weight, self.output_sizes, dim=0)):
                self.weight_loader(param, part, i)
            return
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"shard_id must be in 0..{len(self.output_sizes) - 1}, got {shard_id!r}")
        n = self.local_sizes[shard_id]
        offset = sum(self.local_sizes[:shard_id])
        dst = param.data.narrow(0, offset, n)
        _check_full(loaded_weight, 0, self.output_sizes[shard_id], f"merged shard {shard_id}")
        _copy_checked(dst, loaded_weight.narrow(0, self.tp_rank * n, n), f"merged shard {shard_id}")


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection, heads split over tp ranks.

    Each rank holds [q heads ; k heads ; v heads] of its share. When `total_num_kv_heads < tp size`
    every KV head is replicated on `tp / total_num_kv_heads` consecutive ranks.
    """

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: Optional[int] = None,
        bias: bool = False,
        tp: Optional[GroupCoordinator] = None,
        params_dtype: torch.dtype = torch.float32,
    ):
        tp_size = tp.size if tp is not None else 1
        total_num_kv_heads = total_num_heads if total_num_kv_heads is None else total_num_kv_heads
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = _divide(total_num_heads, tp_size, "number of attention heads")
        if total_num_kv_heads >= tp_size:
            self.num_kv_heads = _divide(total_num_kv_heads, tp_size, "number of KV heads")
            self.num_kv_head_replicas = 1
        else:
            if tp_size % total_num_kv_heads:
                raise ValueError(
                    f"tp size ({tp_size}) must be a multiple of the number of KV heads ({total_num_kv_heads}) "
                    f"when there are fewer KV heads than tp ranks"
                )
            self.num_kv_heads = 1
            self.num_kv_head_replicas = tp_size // total_num_kv_heads
        self.q_size = self.num_heads * head_size
        self.kv_size = self.num_kv_heads * head_size
        out_total = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp_size
        super().__init__(hidden_size, out_total, bias, tp, params_dtype)

    def checkpoint_shape(self, shard_id: ShardId, param: nn.Parameter) -> tuple[int, ...]:
        """FULL shape of the checkpoint tensor that `weight_loader(param, tensor, shard_id)` takes."""
        if shard_id not in ("q", "k", "v"):
            raise ValueError(f"QKV shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
        heads = self.total_num_heads if shard_id == "q" else self.total_num_kv_heads
        return (heads * self.head_size, *param.shape[1:])

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        if shard_id is None:  # fused qkv checkpoint tensor
            total_q = self.total_num_heads * self.head_size
            total_kv = self.total_num_kv_heads * self.head_size
            q, k, v = torch.split(loaded_weight, [total_q, total_kv, total_kv], dim=0)
            for sid, part in (("q", q), ("k", k), ("v", v)):
                self.weight_loader(param, part, sid)
            return
        if shard_id == "q":
            offset, n, rank, heads = 0, self.q_size, self.tp_rank, self.total_num_heads
        elif shard_id in ("k", "v"):
            offset = self.q_size + (self.kv_size if shard_id == "v" else 0)
            n, rank = self.kv_size, self.tp_rank // self.num_kv_head_replicas
            heads = self.total_num_kv_heads
        else:
            raise ValueError(f"QKV shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
        _check_full(loaded_weight, 0, heads * self.head_size, f"qkv shard {shard_id}")
        dst = param.data.narrow(0, offset, n)
        _copy_checked(dst, loaded_weight.narrow(0, rank * n, n), f"qkv shard {shard_id}")


class RowParallelLinear(LinearBase):
    """Y = X A^T with A's columns (inputs) split over tp ranks; outputs summed by all-reduce.

    The input is expected already split (the output of a column-parallel layer). The bias is added
    once: after the reduction, or, unreduced, by tp rank 0 only (so the caller's sum counts it once).
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        tp: Optional[GroupCoordinator] = None,
        params_dtype: torch.dtype = torch.float32,
        reduce_results: bool = True,
    ):
        tp_size = tp.size if tp is not None else 1
        self.input_size_per_partition = _divide(input_size, tp_size, "input size")
        super().__init__(self.input_size_per_partition, output_size, bias, tp, params_dtype)
        self.reduce_results = reduce_results

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        if shard_id is not None:
            raise ValueError(f"RowParallelLinear takes no shard_id, got {shard_id!r}")
        if param.dim() == 1:  # bias: not sharded
            _copy_checked(param.data, loaded_weight, "row-parallel bias")
            return
        n = param.shape[1]
        _check_full(loaded_weight, 1, n * self.tp_size, "row-parallel")
        _copy_checked(param.data, loaded_weight.narrow(1, self.tp_rank * n, n), "row-parallel")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._matmul(x, self._parameters["bias"])
        out = self._matmul(x, None)
        if self.reduce_results:
            out = self.tp.all_reduce(out)
        if self.bias is not None and (self.reduce_results or self.tp_rank == 0):
            out = out + self.bias
        return out
