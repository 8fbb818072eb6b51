"""A tiny llama quantized to W8A8-INT8 by `sglang.test.tiny_w8a8_models` in both real formats
(SGLang's `w8a8_int8`, compressed-tensors `int-quantized`), loaded through the HF loading path and
run through the scheduler:

- against the same quantized math in float32 torch (the dequantized twin with each activation
  quantized per token and widened back, `fake_quant_linears`): greedy tokens identical, every
  step's logits within 1e-4 (the int32 GEMM is exact; only float32 sum order differs);
- against the plain float32 dequantized model (no activation quantization): the first step's
  logits within 0.3 (the error of int8 activations through 4 random layers; the logits span ~6);
- `--quantization w8a8_int8` on the float checkpoint the int8 one was made from (online
  quantization after loading): the same int8 weights and scales, so the same tokens and logits.
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang.srt.platforms.kernel_dispatch import int8_linear_kernels
from sglang.test.scheduler_harness import SchedulerHarness
from sglang.test.tiny_w8a8_models import fake_quant_linears, save_w8a8_pair

NEW_TOKENS = 8
SAME_MATH_TOL = 1e-4
FLOAT_TOL = 0.3
PROMPTS = [[5, 17, 33, 9, 101, 64, 7], [200, 3, 44, 12, 90, 91, 92, 93, 15, 8, 77, 31, 2]]


def _run(path: str, fake_quant: bool = False, **kwargs) -> SchedulerHarness:
    h = SchedulerHarness(model_path=path, max_total_tokens=512, **kwargs)
    if fake_quant:
        assert fake_quant_linears(h.scheduler.runner.model) == 16  # 4 layers x qkv, o, gate_up, down
    for p in PROMPTS:
        h.submit(p, NEW_TOKENS)
    h.run()
    return h


@pytest.mark.parametrize("fmt", ["w8a8_int8", "compressed-tensors"])
def test_w8a8_int8_matches_quantized_math_and_stays_near_float(tmp_path, fmt):
    q_dir, deq_dir = save_w8a8_pair(tmp_path, fmt)
    ours, same_math, plain = _run(q_dir), _run(deq_dir, fake_quant=True), _run(deq_dir)
    layer = ours.scheduler.runner.model.model._stage_layers[0]
    for lin in (
        layer.self_attn.qkv_proj,
        layer.self_attn.o_proj,
        layer.mlp.gate_up_proj,
        layer.mlp.down_proj,
    ):
        assert lin.weight.dtype == torch.int8 and lin.weight_scale.dtype == torch.float32
        # packed after loading for the fused CPU kernel wherever the kernel build has one
        assert (lin.int8_packed is not None) == (int8_linear_kernels(lin.weight_scale.device) is not None)
    for rid in same_math.outputs:
        assert ours.outputs[rid] == same_math.outputs[rid]
        diff = max(float((a - b).abs().max()) for a, b in zip(ours.logits[rid], same_math.logits[rid]))
        assert diff <= SAME_MATH_TOL, f"{rid}: logits max abs diff {diff} against the same quantized math"
        first = float((ours.logits[rid][0] - plain.logits[rid][0]).abs().max())
        assert 0 < first <= FLOAT_TOL, f"{rid}: first-step logits {first} from the float32 model"


@pytest.mark.parametrize("fmt", ["w8a8_int8", "compressed-tensors"])
def test_int8_lm_head_stays_int8_and_matches_its_quantized_math(tmp_path, fmt):
    """A checkpoint holding the (untied) LM head in int8 with its per-row scale (compressed-tensors:
    `re:.*lm_head` among the targets, nothing ignored) keeps the head in int8 (packed for the fused
    kernel where the build has one) and gives the tokens and logits of the same quantized math, the
    head's activations quantized per token too. (Before the int8 head, such a head was widened at
    load: the dtype check fails on that.)"""
    q_dir, deq_dir = save_w8a8_pair(tmp_path, fmt, head=True)
    ours = _run(q_dir)
    head = ours.scheduler.runner.model.lm_head
    assert head.weight.dtype == torch.int8 and head.weight_scale.shape == (552, 1)
    assert head.float32_logits  # float32 rows in, float32 logits out
    assert (head.int8_packed is not None) == (int8_linear_kernels(torch.device("cpu")) is not None)
    h = SchedulerHarness(model_path=deq_dir, max_total_tokens=512)
    assert fake_quant_linears(h.scheduler.runner.model, head=True) == 17
    for p in PROMPTS:
        h.submit(p, NEW_TOKENS)
    h.run()
    for rid in h.outputs:
        assert ours.outputs[rid] == h.outputs[rid]
        diff = max(float((a - b).abs().max()) for a, b in zip(ours.logits[rid], h.logits[rid]))
        assert diff <= SAME_MATH_TOL, f"{rid}: logits max abs diff {diff} against the same quantized math"


def test_online_w8a8_int8_equals_the_int8_checkpoint(tmp_path):
    q_dir, _ = save_w8a8_pair(tmp_path)
    offline, online = _run(q_dir), _run(os.path.join(tmp_path, "src"), quantization="w8a8_int8")
    model = online.scheduler.runner.model
    layer = model.model._stage_layers[3]
    assert (
        layer.mlp.down_proj.weight.dtype == torch.int8 and layer.self_attn.qkv_proj.weight.dtype == torch.int8
    )
    assert model.lm_head.weight.dtype == torch.float32
    for rid in offline.outputs:
        assert online.outputs[rid] == offline.outputs[rid]
        for a, b in zip(online.logits[rid], offline.logits[rid]):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_w8a8_routed_experts_packed_give_the_unpacked_results(tmp_path, monkeypatch):
    """The tiny DeepSeek-V3.2 in W8A8: its routed experts packed for the fused int8 kernel after
    loading (`W8A8Int8MoEMethod.pack_weights`) give the tokens and logits of the torch expert loop
    (the same int32 sums and float rounding; float32 here, so no fused gate)."""
    from sglang.srt.layers.moe.experts import FusedMoE
    from sglang.srt.layers.quantization.w8a8_moe import W8A8Int8MoEMethod

    q_dir, _ = save_w8a8_pair(tmp_path, model="v32")
    packed = _run(q_dir)
    moes = [m for m in packed.scheduler.runner.model.modules() if isinstance(m, FusedMoE)]
    has_kernel = int8_linear_kernels(torch.device("cpu")) is not None
    assert moes and all((getattr(m, "int8_experts", None) is not None) == has_kernel for m in moes)
    monkeypatch.setattr(W8A8Int8MoEMethod, "pack_weights", lambda self, moe: None)
    plain = _run(q_dir)
    assert not any(getattr(m, "int8_experts", None) for m in plain.scheduler.runner.model.modules())
    for rid in plain.outputs:
        assert packed.outputs[rid] == plain.outputs[rid]
        for a, b in zip(packed.logits[rid], plain.logits[rid]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
