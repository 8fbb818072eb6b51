"""W8A8-INT8: int8 weights with per-output-channel scales, activations quantized per token at run
time (both symmetric), multiplied int8 x int8 -> int32 and scaled back.

A weight [N, K] is stored as int8 with `weight_scale` [N, 1] float (real value = weight x scale of
its row; SGLang's `w8a8_int8` and compressed-tensors' `int-quantized` channel format). Each call
quantizes the activation rows x [M, K]: scale_x = amax(|row|) / 127, x_q = round(x / scale_x)
(a zero row gets scale 1); then out[m, n] = int32(x_q[m] . w_q[n]) x scale_x[m] x scale_w[n], in
float32, cast to x's dtype (+ bias).

On CPU with the fused kernels (`kernel_dispatch.int8_linear_op`), the weight is packed once
after loading (`pack_weights`, called by layers/linear_prepack.py; `pack_int8_vnni`) and `apply`
runs all of it in one call (kernels/cpu/csrc/int8_linear.cpp: the same int32 sums and float
rounding); on CUDA and Ascend NPU, the device's own calls (`kernel_dispatch.w8a8_linear_op`,
platforms/accel_quant.py: `torch._int_mm`, torch_npu's quant matmul); otherwise, the torch ops
below. There, the int32 GEMM is the device's
(`platforms.kernel_dispatch.int8_mm_op`: `torch._int_mm`, oneDNN on CPU with VNNI / AMX-INT8 where
present); where there is none, `int8_mm_blockwise` is an exact fallback (float32 products of at most 1024 int8 pairs are exact integers, summed in int32).

Tensor parallelism: the per-row scale shards with the weight's output rows (column-parallel, fused
gate/up and QKV shards) and is whole on every rank of a row-parallel layer. Each rank quantizes
the activation it holds (a row-parallel rank its slice of K), as upstream does.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from sglang.srt.layers.linear import LinearBase, ReplicatedLinear, RowParallelLinear
from sglang.srt.platforms.accel_quant import per_token_quant_int8
from sglang.srt.platforms.kernel_dispatch import int8_linear_op, int8_mm_op, w8a8_linear_op

EXACT_K = 1024  # 1024 x 127 x 127 < 2**24: a float32 sum of this many int8 products is exact
TILE_ROWS = 1024  # weight rows widened per step of the fallback
FUSED_DTYPES = (torch.float32, torch.bfloat16)  # x dtypes of the fused CPU kernel
PACK_LANES = 16  # output columns per block of the packed weight (one 512-bit vector of int32)

Int8MM = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def channel_quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 of a weight [N, K]: (int8 [N, K], float32 scale [N, 1]),
    the format of the checkpoints (and of online quantization)."""
    return per_token_quant_int8(w)


def int8_mm_blockwise(a: torch.Tensor, b: torch.Tensor, tile_rows: int = TILE_ROWS) -> torch.Tensor:
    """Exact int32 a [M, K] @ b [K, N] of int8 tensors without an int8 GEMM: float32 products over K
    chunks of EXACT_K (exact integers) summed in int32; b widened `tile_rows` columns at a time."""
    m, k = a.shape
    n = b.shape[1]
    out = torch.zeros(m, n, dtype=torch.int32, device=a.device)
    for c0 in range(0, n, tile_rows):
        c1 = min(n, c0 + tile_rows)
        for k0 in range(0, k, EXACT_K):
            k1 = min(k, k0 + EXACT_K)
            part = a[:, k0:k1].float() @ b[k0:k1, c0:c1].float()
            out[:, c0:c1] += part.to(torch.int32)
    return out


def pack_int8_vnni(
    weight: torch.Tensor, weight_scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CPU kernel's form of an int8 weight [N, K] and its scale [N, 1] (kernels/cpu/csrc/int8_linear.cpp):
    (packed int8 [ceil(N / 16), ceil(K / 4), 16, 4]: block b, k group g, lane l holds W[16b + l, 4g .. 4g + 3];
    comp int32 [Np] = 128 x the row sums; scale float32 [Np]), N and K padded with zeros to Np, Kp."""
    n, k = weight.shape
    n_pad, k_pad = -(-n // PACK_LANES) * PACK_LANES, -(-k // 4) * 4
    w = torch.zeros(n_pad, k_pad, dtype=torch.int8, device=weight.device)
    w[:n, :k] = weight
    packed = w.view(n_pad // PACK_LANES, PACK_LANES, k_pad // 4, 4).transpose(1, 2).contiguous()
    comp = w.sum(dim=1, dtype=torch.int32).mul_(128)
    scale = torch.zeros(n_pad, dtype=torch.float32, device=weight.device)
    scale[:n] = weight_scale.reshape(-1).float()
    return packed, comp, scale


def w8a8_int8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    mm: Optional[Int8MM] = None,
) -> torch.Tensor:
    """x [..., K] @ dequant(weight [N, K] int8, weight_scale [N, 1])^T with x quantized per token."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    device_op = w8a8_linear_op(x.device) if mm is None else None  # CUDA / NPU: their own calls
    out = device_op(x2, weight, weight_scale, bias) if device_op is not None else None
    if out is not None:
        return out.reshape(*shape[:-1], weight.shape[0])
    x_q, x_scale = per_token_quant_int8(x2)
    if mm is None:
        mm = int8_mm_op(x.device) or int8_mm_blockwise
    acc = (
        mm(x_q, weight.t())
        if x2.shape[0]
        else torch.zeros(0, weight.shape[0], dtype=torch.int32, device=x.device)
    )
    out = acc.float().mul_(x_scale).mul_(weight_scale.reshape(1, -1)).to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*shape[:-1], weight.shape[0])


class W8A8Int8LinearMethod:
    """Holds a linear layer's weight as int8 with per-row scales; the layer calls `apply`."""

    def create_weights(self, layer: LinearBase, name: str) -> None:
        """Replace `layer.weight` by an int8 parameter and add `weight_scale` [out_local, 1]."""
        out_local, in_local = layer.weight.shape
        weight = nn.Parameter(torch.empty(out_local, in_local, dtype=torch.int8), requires_grad=False)
        weight.weight_loader = layer.weight_loader  # type: ignore[attr-defined]
        scale = nn.Parameter(torch.ones(out_local, 1, dtype=torch.float32), requires_grad=False)
        scale.weight_loader = self.scale_loader(layer, name)  # type: ignore[attr-defined]
        layer.weight = weight
        layer.weight_scale = scale
        layer.skip_prepack = True  # the platform's packed copies are for float weights
        layer.quant_method = self

    def scale_loader(self, layer: nn.Module, name: str) -> Callable[..., None]:
        """How `weight_scale` [out_local, 1] loads: sharded like the layer's output rows."""
        return _scale_loader(layer, name)

    def pack_weights(self, layer: LinearBase) -> Optional[int]:
        """After loading: the weight packed for the platform's fused int8 linear where its kernel
        build has one (`layer.int8_packed`). The packed copy replaces the plain int8 weight, whose
        memory is released (`layer.weight` keeps its shape and dtype on the meta device; `int8_weight`
        unpacks it). Returns the bytes this adds (the packing's padding, sums and scales), or None
        where nothing was packed (no kernel, or packed already)."""
        if layer.weight.is_meta:  # packed already
            return None
        op = int8_linear_op(layer.weight.device)
        if op is None or layer.weight.dim() != 2:
            layer.int8_packed = None
            return None
        packed = pack_int8_vnni(layer.weight.detach(), layer.weight_scale.detach())
        layer.int8_packed = (*packed, op)
        layer.int8_out = layer.weight.shape[0]  # N, a plain attribute: read on every call
        freed = layer.weight.numel() * layer.weight.element_size()
        layer.weight = meta_like(layer.weight)
        return sum(t.numel() * t.element_size() for t in packed) - freed

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        packed = getattr(layer, "int8_packed", None)
        if packed is None or x.numel() == 0:
            return w8a8_int8_linear(x, int8_weight(layer), layer.weight_scale, bias)
        return fused_int8_linear(x, packed, layer.int8_out, bias)

    def apply_swiglu(
        self, layer: LinearBase, x: torch.Tensor, bias: Optional[torch.Tensor]
    ) -> Optional[torch.Tensor]:
        """silu(gate) * up of a [gate; up] layer in one kernel call (the gate in the GEMM's epilogue:
        the [T, 2d] activation is never written), where the packed kernel takes it: a bf16 x, both
        halves whole 16-column blocks, a bias of x's dtype; else None (the caller runs the layer and
        the gate apart). Same bits as `apply` then the kernels' silu_and_mul."""
        packed = getattr(layer, "int8_packed", None)
        n = layer.weight.shape[0]
        if packed is None or x.dtype != torch.bfloat16 or x.numel() == 0 or n % (2 * PACK_LANES):
            return None
        if bias is not None and bias.dtype != x.dtype:
            return None
        return fused_int8_linear(x, packed, n, bias, swiglu=True)


def meta_like(weight: torch.Tensor) -> nn.Parameter:
    """A parameter of `weight`'s shape and dtype on the meta device: what stays of a weight whose
    packed copy replaced it (its memory released)."""
    return nn.Parameter(torch.empty(weight.shape, dtype=weight.dtype, device="meta"), requires_grad=False)


def int8_weight(layer: LinearBase) -> torch.Tensor:
    """The layer's int8 weight [N, K]: the plain one, or unpacked from `pack_weights`' copy."""
    if not layer.weight.is_meta:
        return layer.weight
    n, k = layer.weight.shape
    return unpack_int8_vnni(layer.int8_packed[0], n, k)


def unpack_int8_vnni(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """`pack_int8_vnni`'s packed weight back to the int8 [n, k] it was packed from."""
    blocks, groups = packed.shape[:2]
    return packed.transpose(1, 2).reshape(blocks * PACK_LANES, groups * 4)[:n, :k]


def fused_int8_linear(
    x: torch.Tensor, packed: tuple, n: int, bias: Optional[torch.Tensor] = None, swiglu: bool = False
) -> torch.Tensor:
    """`w8a8_int8_linear` in one kernel call on `pack_weights`' (packed, comp, scale, kernel): the
    same int32 sums and float rounding (a bias of another dtype is added after, as torch would).
    swiglu: the [gate; up] layer's silu(gate) * up, n / 2 columns (`apply_swiglu`'s conditions).
    An x of another dtype (float16) runs widened to float32, the result rounded to x's dtype and
    the bias added after: the reference's bits, and no unpacked copy of the weight."""
    w, comp, scale, kernel = packed
    dtype = x.dtype
    if (
        not swiglu
        and x.dim() == 2
        and x.is_contiguous()
        and (dtype == torch.bfloat16 or dtype == torch.float32)
    ):
        if bias is None or bias.dtype == dtype:  # the usual decode / prefill call: no reshapes (~3 us)
            return kernel(x, w, comp, scale, n, bias)
    if dtype not in FUSED_DTYPES and not swiglu:
        out = fused_int8_linear(x.float(), packed, n).to(dtype)
        return out if bias is None else out + bias
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    fused_bias = bias if bias is None or bias.dtype == x.dtype else None
    if swiglu:
        return kernel(x2, w, comp, scale, n, fused_bias, swiglu=True).view(*x.shape[:-1], n // 2)
    out = kernel(x2, w, comp, scale, n, fused_bias)
    if bias is not None and fused_bias is None:
        out = out + bias
    return out.view(*x.shape[:-1], n)


def _scale_loader(layer: LinearBase, name: str):
    """The scale [N, 1] shards like the weight's output rows: column-parallel kinds (plain, merged,
    QKV) reuse the layer's own loader; row-parallel and replicated layers hold it whole."""

    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        loaded = loaded.float().reshape(-1, 1)
        if isinstance(layer, (RowParallelLinear, ReplicatedLinear)):
            if tuple(loaded.shape) != tuple(param.shape):
                raise ValueError(
                    f"{name}.weight_scale: shape mismatch, parameter {tuple(param.shape)} vs "
                    f"checkpoint {tuple(loaded.shape)}"
                )
            param.data.copy_(loaded)
        elif shard_id is None:
            layer.weight_loader(param, loaded)
        else:
            layer.weight_loader(param, loaded, shard_id)

    return load
