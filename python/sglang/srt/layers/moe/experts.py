"""Routed experts of one MoE layer, sharded over expert-parallel and MoE-tensor-parallel ranks.

Expert e lives on moe_ep rank `e // (num_experts / ep)`; inside it, each expert's intermediate dim is
split over the moe_tp ranks (gate/up rows, down columns). A rank therefore returns a *partial* sum:
its experts, its slice of their intermediate dim. The caller combines partials across ranks
(`ep_dispatch.MoEDispatcher`).

Weights: w13_weight [local experts, 2 * I_local, hidden] = [gate ; up], w2_weight [local experts,
hidden, I_local]. Checkpoint names: `experts.{e}.gate_proj/up_proj/down_proj.weight` (shard ids
("w1", e), ("w3", e), ("w2", e)), or the fused all-expert tensors of HF's in-memory layout
`experts.gate_up_proj` [E, 2I, hidden] / `experts.down_proj` [E, hidden, I] (shard ids "w13", "w2").

`fused_experts_ref` is the torch reference implementation (the correctness oracle of fast kernels).
"""

from __future__ import annotations

import re
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.distributed.parallel_state import GroupCoordinator

ExpertShardId = Union[str, tuple[str, int]]
_EXPERT_RE = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED_RE = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")
_PROJ_SHARD = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def match_expert_weight(name: str) -> Optional[tuple[str, ExpertShardId]]:
    """Map a checkpoint tensor name of a routed expert to (parameter name, shard id), else None."""
    m = _EXPERT_RE.search(name)
    if m:
        shard = _PROJ_SHARD[m.group(2)]
        param = "w2_weight" if shard == "w2" else "w13_weight"
        return name[: m.start()] + ".experts." + param, (shard, int(m.group(1)))
    m = _FUSED_RE.search(name)
    if m:
        fused = m.group(1) == "gate_up_proj"
        return name[: m.start()] + ".experts." + ("w13_weight" if fused else "w2_weight"), (
            "w13" if fused else "w2"
        )
    return None


SMALL_ROUTE = 64  # (token, expert) pairs up to which the routing is sorted in Python (decode)


def expert_order(topk_ids: torch.Tensor, expert_start: int, num_local: int) -> tuple[torch.Tensor, list[int]]:
    """The flat positions (t * k + j) of the pairs routed to the local experts [expert_start,
    expert_start + num_local), ordered by local expert then position, and each local expert's count.
    Up to SMALL_ROUTE pairs (decode batches) sorted in Python from one copy of the ids (a dozen
    small torch ops cost more there; both ways read the ids back once); else by torch."""
    flat = topk_ids.reshape(-1)
    if flat.numel() <= SMALL_ROUTE:
        pairs = sorted(
            (e - expert_start, i) for i, e in enumerate(flat.tolist()) if 0 <= e - expert_start < num_local
        )
        counts = [0] * num_local
        for e, _ in pairs:
            counts[e] += 1
        return torch.tensor([i for _, i in pairs], dtype=torch.int64, device=flat.device), counts
    flat = flat - expert_start
    sel = ((flat >= 0) & (flat < num_local)).nonzero().squeeze(1)
    local_ids = flat[sel]
    order = torch.argsort(local_ids, stable=True)
    sel, local_ids = sel[order], local_ids[order]
    return sel, torch.bincount(local_ids, minlength=num_local).tolist()


def fused_experts_ref(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_start: int = 0,
    expert_linear: Optional[Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]] = None,
    expert_swiglu: Optional[Callable[[torch.Tensor, int], Optional[torch.Tensor]]] = None,
) -> torch.Tensor:
    """sum_j topk_weights[t, j] * expert_{ids[t, j]}(x[t]) over the experts held here.

    x [n, hidden]; w13 [E_local, 2I, hidden]; w2 [E_local, hidden, I]; ids are global expert ids, the
    local ones are [expert_start, expert_start + E_local). SwiGLU experts; accumulates in float32.
    `expert_linear(x, w, e)` multiplies by local expert e's weight w (w13 or w2; default F.linear
    by w[e]; a quantized method widens its 1-byte weight there). `expert_swiglu(x, e)`: silu(gate) *
    up of local expert e in one call where a kernel fuses the gate into its GEMM, else None (then
    the w13 linear and the gate run apart).
    """
    linear = expert_linear or (lambda rows, w, e: F.linear(rows, w[e]))
    n, k = topk_ids.shape
    num_local = w13.shape[0]
    out = torch.zeros((n, x.shape[1]), dtype=torch.float32, device=x.device)
    sel, counts = expert_order(topk_ids, expert_start, num_local)
    if sel.numel() == 0:
        return out.to(x.dtype)
    tokens = sel // k
    weights = topk_weights.reshape(-1)[sel].float()
    inter = w2.shape[2]
    # one gather of every (token, expert) row in expert order, one scale and one scatter-add at the
    # end: per expert only its two linears run (the same sums in the same order as adding expert
    # by expert: index_add_ walks the rows in order)
    xs = x[tokens]
    ys = []
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        rows = xs[start : start + c]
        h = expert_swiglu(rows, e) if expert_swiglu is not None else None
        if h is None:
            gate_up = linear(rows, w13, e)
            h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        ys.append(linear(h, w2, e))
        start += c
    y = ys[0] if len(ys) == 1 else torch.cat(ys)
    out.index_add_(0, tokens, y.float() * weights[:, None])
    return out.to(x.dtype)


class FusedMoE(nn.Module):
    """This rank's routed experts (see module docstring for the sharding)."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        ep: Optional[GroupCoordinator],
        moe_tp: Optional[GroupCoordinator],
        dtype: torch.dtype,
    ):
        super().__init__()
        ep_size, ep_rank = (ep.size, ep.rank) if ep is not None else (1, 0)
        self.tp_size, self.tp_rank = (moe_tp.size, moe_tp.rank) if moe_tp is not None else (1, 0)
        if num_experts % ep_size:
            raise ValueError(
                f"number of experts ({num_experts}) must be divisible by the ep size ({ep_size})"
            )
        if intermediate_size % self.tp_size:
            raise ValueError(
                f"moe_intermediate_size ({intermediate_size}) must be divisible by the MoE tp size ({self.tp_size})"
            )
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_local_experts = num_experts // ep_size
        self.expert_start = ep_rank * self.num_local_experts
        self.intermediate_per_partition = intermediate_size // self.tp_size
        i_loc = self.intermediate_per_partition
        self.w13_weight = nn.Parameter(
            torch.empty((self.num_local_experts, 2 * i_loc, hidden_size), dtype=dtype), requires_grad=False
        )
        self.w2_weight = nn.Parameter(
            torch.empty((self.num_local_experts, hidden_size, i_loc), dtype=dtype), requires_grad=False
        )
        self.w13_weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        self.w2_weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        self.quant_method = None  # e.g. layers/quantization Fp8BlockMoEMethod: it then computes
        # float experts: ([(w13 packed, w2 packed) per local expert], kernel), set once after loading
        # where the platform packs linear weights (layers/linear_prepack.py)
        self.packed_experts: Optional[tuple[list, Callable]] = None

    def checkpoint_tensors(self, param_name: str) -> list[tuple[str, tuple[int, ...]]]:
        """The per-expert checkpoint tensors `param_name` ("w13_weight" or "w2_weight") is made of:
        (name relative to this module, e.g. "3.gate_proj.weight", FULL shape), every expert."""
        h, i = self.hidden_size, self.intermediate_size
        if param_name == "w13_weight":
            return [
                (f"{e}.{p}.weight", (i, h)) for e in range(self.num_experts) for p in ("gate_proj", "up_proj")
            ]
        if param_name == "w2_weight":
            return [(f"{e}.down_proj.weight", (h, i)) for e in range(self.num_experts)]
        raise ValueError(f"FusedMoE has no parameter {param_name!r}")

    def _local(self, expert_id: int) -> Optional[int]:
        e = expert_id - self.expert_start
        if not 0 <= expert_id < self.num_experts:
            raise ValueError(f"expert id {expert_id} out of range [0, {self.num_experts})")
        return e if 0 <= e < self.num_local_experts else None

    def _load_one(self, param: nn.Parameter, loaded: torch.Tensor, kind: str, local: int) -> None:
        i_loc, r = self.intermediate_per_partition, self.tp_rank
        if kind == "w2":
            expected = (self.hidden_size, self.intermediate_size)
            src = loaded.narrow(1, r * i_loc, i_loc) if tuple(loaded.shape) == expected else None
            dst = param.data[local]
        else:
            expected = (self.intermediate_size, self.hidden_size)
            src = loaded.narrow(0, r * i_loc, i_loc) if tuple(loaded.shape) == expected else None
            dst = param.data[local].narrow(0, 0 if kind == "w1" else i_loc, i_loc)
        if src is None:
            raise ValueError(f"expert {kind}: checkpoint shape {tuple(loaded.shape)}, expected {expected}")
        dst.copy_(src)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ExpertShardId = None
    ) -> None:
        """Copy this rank's part of one expert's projection (("w1"|"w3"|"w2", expert_id)) or of a fused
        all-experts tensor ("w13" [E, 2I, hidden], "w2" [E, hidden, I]); other ranks' experts are skipped."""
        if isinstance(shard_id, tuple):
            kind, expert = shard_id
            if kind not in ("w1", "w3", "w2"):
                raise ValueError(f"expert shard kind must be w1, w3 or w2, got {kind!r}")
            local = self._local(int(expert))
            if local is not None:
                self._load_one(param, loaded, kind, local)
            return
        if shard_id not in ("w13", "w2") or loaded.dim() != 3 or loaded.shape[0] != self.num_experts:
            raise ValueError(f"fused expert tensor: bad shard id {shard_id!r} or shape {tuple(loaded.shape)}")
        for local in range(self.num_local_experts):
            tensor = loaded[self.expert_start + local]
            if shard_id == "w2":
                self._load_one(param, tensor, "w2", local)
            else:
                gate, up = tensor.split(self.intermediate_size, dim=0)
                self._load_one(param, gate, "w1", local)
                self._load_one(param, up, "w3", local)

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """Partial output [n, hidden] of this rank's experts (not reduced across ranks)."""
        if self.quant_method is not None:
            return self.quant_method.apply(self, x, topk_weights, topk_ids)
        linear, swiglu = self._packed_calls(x)
        return fused_experts_ref(
            x, self.w13_weight, self.w2_weight, topk_weights, topk_ids, self.expert_start, linear, swiglu
        )

    def _packed_calls(self, x: torch.Tensor) -> tuple[Optional[Callable], Optional[Callable]]:
        """The expert loop's linear and fused gate on the packed experts (the dense linears' kernel,
        `linear_prepack.linear`'s contract), or (None, None): plain F.linear."""
        if self.packed_experts is None or x.dtype != self.w13_weight.dtype:
            return None, None
        packed, kernel = self.packed_experts
        w13 = self.w13_weight

        def linear(rows: torch.Tensor, w: torch.Tensor, e: int) -> torch.Tensor:
            return kernel(rows.contiguous(), packed[e][0 if w is w13 else 1], None)

        gate = getattr(kernel, "swiglu", None)
        if gate is None:
            return linear, None
        return linear, lambda rows, e: gate(rows, packed[e][0], None)

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_local_experts}/{self.num_experts} (from {self.expert_start}), "
            f"hidden={self.hidden_size}, intermediate={self.intermediate_per_partition}/{self.intermediate_size}"
        )
