"""The tiny llama (its LM head in int8 too) and the tiny DeepSeek-V3.2, quantized to W8A8-INT8
(`sglang.test.tiny_w8a8_models`, SGLang's `w8a8_int8` format), on gloo ranks at tp 2 (int8
weights and their per-row scales sharded together, the head's by vocab rows; each row-parallel
rank quantizes its own slice of the activation, as upstream does), the
V3.2 at tp 2 + ep 2 (whole int8 experts per rank), and pp 2. The driver packs the linears and the
routed experts for the fused int8 kernel after loading, as the model runner does (where the kernel
build has one), so the packed path runs at every layout.

Checked: greedy tokens identical to the same quantized math run in float32 torch at tp 1 on the
dequantized twin (`fake_quant_linears`, its row-parallel activations quantized per slice of K / tp),
and the logits: at least 30 % of all rows (every step's, counted together) within 1e-4, every row
within 0.25. (The int32 GEMM is exact and the rest differs by float32 sum order, ~1e-6; but an
activation that sits on an int8 rounding boundary can round the other way, moving by one int8 step,
amax / 127: that row and the causal rows after it then differ by a few 1e-2 (0.107 once on a Zen 5,
tp 2). The tiny V3.2 shows it: at the last step here, and on an AMD EPYC (AVX-512, no AMX) at one
row of a three-row decode step, so the share is not taken per step.) Workload: the CP test driver
(chunked prefills beside decodes, then a radix-cache hit)."""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.platforms.kernel_dispatch import int8_linear_op
from sglang.test import cp_moe_driver
from sglang.test.tiny_w8a8_models import fake_quant_linears, save_w8a8_pair

pytestmark = pytest.mark.slow  # spawns gloo ranks

TOL = 1e-4  # most rows
# share of all rows (all steps together) within TOL: an activation rounded the other way in a
# sequence's prefill carries into every later row of that sequence (its KV, then the radix hit), so
# with three sequences up to about two thirds of the rows can follow one flip (49 % within TOL on a
# Zen 5 at tp 2); a wrong scale, shard or GEMM moves every row
ROW_SHARE = 0.3
FLIP_TOL = 0.25  # every row (one activation rounded the other way: up to 0.107 seen on a Zen 5)
NEW_TOKENS = 8
LAYOUTS = ({"tp": 2}, {"tp": 2, "moe_ep": 2}, {"pp": 2})
MODELS = ("llama", "v32")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    # the tiny llama's (untied) LM head in int8 too: its vocab rows and scales shard at tp 2
    return {
        m: save_w8a8_pair(tmp_path_factory.mktemp(f"w8a8_{m}"), model=m, head=m == "llama") for m in MODELS
    }


def _same(got: dict, ref: dict, tag: str) -> None:
    assert got["tokens"] == ref["tokens"], tag
    assert len(got["logits"]) == len(ref["logits"])
    per_step = []
    for step, (a, b) in enumerate(zip(got["logits"], ref["logits"])):
        rows = (a - b).abs().reshape(-1, a.shape[-1]).amax(-1)
        assert float(rows.max()) <= FLIP_TOL, f"{tag} step {step}: logits max abs diff {float(rows.max())}"
        per_step.append(rows)
    rows = torch.cat(per_step)
    close = float((rows <= TOL).float().mean())
    assert close >= ROW_SHARE, f"{tag}: only {close:.0%} of {rows.numel()} rows within {TOL}"


def _ranks(rank: int, world_size: int, paths: list) -> list:
    return [
        cp_moe_driver.generate(path, ParallelGroups.build(ParallelLayout(**lay), rank), "zigzag", NEW_TOKENS)
        for path, model in zip(paths, MODELS)
        for lay in LAYOUTS
        if model == "v32" or "moe_ep" not in lay
    ]


def _shards(lay: dict) -> tuple[int, int]:
    """(row-parallel slices, MoE-tp slices) of a layout's activations (ep: whole experts)."""
    tp = lay.get("tp", 1)
    return tp, tp // lay.get("moe_ep", 1)


def _reference(monkeypatch, path: str, shards: tuple[int, int], head: bool) -> dict:
    """The quantized math in float32 torch at tp 1, on the dequantized twin."""
    load = cp_moe_driver.load_model

    def load_fake_quant(p, groups):
        hf_config, model = load(p, groups)
        assert fake_quant_linears(model, *shards, head=head) > 0
        return hf_config, model

    with monkeypatch.context() as m:
        m.setattr(cp_moe_driver, "load_model", load_fake_quant)
        return cp_moe_driver.generate(path, ParallelGroups.single(), "zigzag", NEW_TOKENS)


def _assert_packed(path: str, model: str, head: bool) -> None:
    """The driver's model holds its W8A8 weights packed for the fused kernel (this build has it);
    `head`: the LM head among them."""
    if int8_linear_op(torch.device("cpu")) is None:
        return  # no fused int8 kernel in this build: the torch path runs, as in the runner
    _, m = cp_moe_driver.load_model(path, ParallelGroups.single())
    packed = [mod for mod in m.modules() if getattr(mod, "int8_packed", None) is not None]
    experts = [mod for mod in m.modules() if getattr(mod, "int8_experts", None) is not None]
    assert packed, f"{model}: no W8A8 linear packed"
    assert (len(experts) > 0) == (model == "v32"), f"{model}: routed experts packed: {len(experts)}"
    assert (getattr(m.lm_head, "int8_packed", None) is not None) == head, f"{model}: LM head packed"


def test_w8a8_int8_parallel_matches_quantized_math_at_tp1(pairs, monkeypatch):
    refs = {}
    for model, (q_dir, deq_dir) in pairs.items():
        head = model == "llama"
        refs[model] = {
            sh: _reference(monkeypatch, deq_dir, sh, head) for sh in {(1, 1), *map(_shards, LAYOUTS)}
        }
        assert len({tuple(t) for t in refs[model][(1, 1)]["tokens"]}) == 3  # not degenerate
        _assert_packed(q_dir, model, head)
        tp1 = cp_moe_driver.generate(q_dir, ParallelGroups.single(), "zigzag", NEW_TOKENS)
        _same(tp1, refs[model][(1, 1)], f"{model} tp1")
        # 1-byte linear weights (the tiny llama's float32 embeddings and head are a third of it);
        # the V3.2's routed experts in int8 too
        assert tp1["param_bytes"] < (0.75 if model == "llama" else 0.5) * refs[model][(1, 1)]["param_bytes"]
    results = run_ranks(_ranks, 2, args=([pairs[m][0] for m in MODELS],), timeout=500)
    runs_of = [(m, lay) for m in MODELS for lay in LAYOUTS if m == "v32" or "moe_ep" not in lay]
    for rank, runs in enumerate(results):
        assert len(runs) == len(runs_of)
        for (model, lay), got in zip(runs_of, runs):
            if "pp" in lay and rank == 0:
                continue  # the first pipeline stage computes no logits
            _same(got, refs[model][_shards(lay)], f"w8a8 {model} {lay} rank {rank}")
