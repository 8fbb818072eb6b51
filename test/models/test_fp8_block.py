"""A tiny FP8 block-quantized DeepSeek-V3.2 checkpoint (DeepSeek's format, 16 x 16 blocks) against
the same weights dequantized to float32 and saved plain: greedy tokens identical, logits close
(the FP8 path widens the same e4m3 values with the same scales; only the order of float32 sums
differs). The FP8 linears keep 1-byte weights with their block scales."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sglang.srt.layers.quantization.fp8_block import FP8_DTYPE, is_power_of_two
from sglang.test.scheduler_harness import SchedulerHarness
from sglang.test.tiny_fp8_models import save_fp8_pair

NEW_TOKENS = 6
LOGIT_TOL = 1e-3
PROMPTS = [[5, 17, 33, 9, 101, 64, 7], [200, 3, 44, 12, 90, 91, 92, 93, 15, 8, 77, 31, 2]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_fp8_pair(tmp_path_factory.mktemp("fp8_v32"))


def _run(path: str) -> SchedulerHarness:
    h = SchedulerHarness(model_path=path, max_total_tokens=512)
    for p in PROMPTS:
        h.submit(p, NEW_TOKENS)
    h.run()
    return h


def test_fp8_checkpoint_matches_dequantized_float32(pair):
    fp8_dir, deq_dir = pair
    ref, ours = _run(deq_dir), _run(fp8_dir)
    model = ours.scheduler.runner.model
    layer = model.model._stage_layers[1]  # an MoE layer: MLA projections, shared experts
    attn = layer.self_attn
    for lin in (
        attn.q_a_proj,
        attn.q_b_proj,
        attn.kv_a_proj_with_mqa,
        attn.o_proj,
        layer.mlp.shared_experts.down_proj,
    ):
        assert lin.weight.dtype == FP8_DTYPE and lin.weight_scale_inv.dtype == torch.float32
    assert attn.kv_b_proj.weight.dtype == torch.float32  # absorbed: widened once at load
    experts = layer.mlp.experts  # routed experts: 1 byte with a block scale per expert and piece
    assert experts.w13_weight.dtype == FP8_DTYPE and experts.w2_weight.dtype == FP8_DTYPE
    assert experts.w13_weight_scale_inv.shape == (8, 2 * 32 // 16, 64 // 16)
    assert experts.w2_weight_scale_inv.shape == (8, 64 // 16, 32 // 16)
    dense = model.model._stage_layers[0].mlp
    assert dense.gate_up_proj.weight.dtype == FP8_DTYPE
    assert dense.gate_up_proj.weight_scale_inv.shape == (2 * 128 // 16, 64 // 16)
    for rid in ref.outputs:
        assert ours.outputs[rid] == ref.outputs[rid]
        diff = max(float((a - b).abs().max()) for a, b in zip(ours.logits[rid], ref.logits[rid]))
        assert diff <= LOGIT_TOL, f"{rid}: logits max abs diff {diff}"


def test_ue8m0_checkpoint_matches_dequantized_and_checks_its_scales(tmp_path):
    """`scale_fmt: ue8m0` (V3.1 / V3.2's checkpoints: power-of-two block scales): served like any FP8
    checkpoint, identical to its own dequantized twin; a checkpoint that says ue8m0 but carries a
    scale that is not a power of two is refused at load, naming the tensor."""
    fp8_dir, deq_dir = save_fp8_pair(tmp_path / "ue8m0", scale_fmt="ue8m0")
    with safe_open(os.path.join(fp8_dir, "model.safetensors"), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    scales = [name for name in tensors if name.endswith("_scale_inv")]
    assert scales and all(is_power_of_two(tensors[n]) for n in scales)
    ref, ours = _run(deq_dir), _run(fp8_dir)
    for rid in ref.outputs:
        assert ours.outputs[rid] == ref.outputs[rid]
    bad = sorted(scales)[0]
    tensors[bad] = tensors[bad] * 1.5  # no longer a power of two
    save_file(tensors, os.path.join(fp8_dir, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"{bad}: quantization_config says scale_fmt ue8m0"):
        SchedulerHarness(model_path=fp8_dir, max_total_tokens=512)
