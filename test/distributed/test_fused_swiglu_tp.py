"""The gate_up layer's fused SwiGLU (`MergedColumnParallelLinear.fused_swiglu`) on tp 2 gloo ranks,
bf16 (bf16_linear's epilogue on AMX) and W8A8-INT8 (int8_linear's): each rank's [gate_r; up_r]
shard pairs its own gate and up columns. Per rank the fused call gives the same bits as the layer
then SiluAndMul, and the columns of the unsharded tp 1 layer's gate that are this rank's; LlamaMLP's
all-reduced output matches tp 1 within bf16 rounding. (Parity tests of whole models run float32,
where the fused gate declines: this is where its tp > 1 path is checked.)"""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.linear_prepack import prepack_linear_weights
from sglang.srt.layers.quantization.w8a8_int8 import W8A8Int8LinearMethod, channel_quantize_int8
from sglang.srt.models.llama import LlamaMLP
from sglang.srt.platforms import get_platform

pytestmark = pytest.mark.slow  # spawns gloo ranks

HIDDEN, INTER = 128, 192  # per rank at tp 2: halves of 96 columns, whole 16-column blocks
ROWS = (1, 7, 40)
MLP_RTOL = 2e-2  # the down projection's bf16 partial sums, all-reduced at tp 2 vs one sum at tp 1


def _weights() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return torch.randn(2 * INTER, HIDDEN, generator=g) * 0.05, torch.randn(HIDDEN, INTER, generator=g) * 0.05


def _load(layer, w: torch.Tensor, quant: bool) -> None:
    if not quant:
        layer.weight.weight_loader(layer.weight, w.bfloat16())
        return
    W8A8Int8LinearMethod().create_weights(layer, "layer")
    wq, ws = channel_quantize_int8(w)
    layer.weight.weight_loader(layer.weight, wq)
    layer.weight_scale.weight_loader(layer.weight_scale, ws)


def _mlp(tp, quant: bool) -> LlamaMLP:
    mlp = LlamaMLP(HIDDEN, INTER, tp, torch.bfloat16, bias=False)
    w_gu, w_down = _weights()
    _load(mlp.gate_up_proj, w_gu, quant)
    _load(mlp.down_proj, w_down, quant)
    prepack_linear_weights(mlp, get_platform("cpu"))
    return mlp


def _check(rank: int, tp, quant: bool) -> int:
    """Rows checked through the fused path (0 where this build has no fused kernel)."""
    local, whole = _mlp(tp, quant), _mlp(None, quant)
    half = INTER // tp.size
    cols = slice(rank * half, (rank + 1) * half)
    fused_rows = 0
    for rows in ROWS:
        x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows)).bfloat16()
        fused = local.gate_up_proj.fused_swiglu(x)
        ref = whole.gate_up_proj.fused_swiglu(x)
        if fused is None or ref is None:
            continue
        fused_rows += rows
        assert fused.shape == (rows, half)
        assert torch.equal(fused, local.act_fn(local.gate_up_proj(x))), (rank, rows)
        # the same sums over the same K: this rank's columns of the unsharded gate
        torch.testing.assert_close(fused, ref[:, cols], rtol=1 / 128, atol=1e-3)
        torch.testing.assert_close(local(x).float(), whole(x).float(), rtol=MLP_RTOL, atol=MLP_RTOL)
    return fused_rows


def _ranks(rank: int, world_size: int) -> dict:
    tp = ParallelGroups.build(ParallelLayout(tp=world_size), rank).tp
    return {"bf16": _check(rank, tp, False), "w8a8": _check(rank, tp, True)}


def test_fused_gate_at_tp2_pairs_each_ranks_gate_and_up():
    if get_platform("cpu").kernels.fused() is None:
        pytest.skip("no CPU kernel build here (the fused gate needs one)")
    results = run_ranks(_ranks, 2, timeout=300)
    assert all(r["w8a8"] == sum(ROWS) for r in results)  # int8_linear: every kernel build
    # bf16_linear's epilogue: AMX builds only (elsewhere the layer declines and runs both)
    assert len({r["bf16"] for r in results}) == 1 and results[0]["bf16"] in (0, sum(ROWS))
