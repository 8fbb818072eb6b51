"""SmolLM2-135M (the embedded default model's weights, float32) quantized online to W8A8-INT8
(`--quantization w8a8_int8`'s `quantize_online`): perplexity of a fixed English passage and top-1
agreement with the float32 model, teacher-forced through the model's own forward.

Measured on the passage below: float32 21.68, W8A8 22.15 (+2.1 %), top-1 86.7 %. The bound is the
issue's (perplexity up by at most 3 %). SmolLM2 has activation outliers (hidden rows with |x| in
the hundreds to thousands), so text unlike its training data costs more: the project README's
first 2,000 characters (markdown, code) rose 6 %."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.linear_prepack import pack_quantized_linears
from sglang.srt.layers.quantization.online import quantize_online
from sglang.srt.model_loader.default_model import find_default_model
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test import cp_moe_driver
from sglang.test.smollm2_reference import cached_hf_dir

pytestmark = pytest.mark.slow  # a real 135M model, two teacher-forced passes

PASSAGE = (
    "The river runs through the middle of the old town, and on summer evenings people walk along "
    "its banks to watch the boats come in. Most of the houses near the water were built more than "
    "two hundred years ago, when the town was a busy port for grain and timber. Today the harbour "
    "is quieter. Fishermen still sell their catch at the market on Saturday mornings, but many of "
    "the warehouses have become shops, cafes and small museums. Visitors often say that the best "
    "time to arrive is early in the morning, before the streets fill up, when the light on the "
    "water is soft and the bakeries have just opened their doors."
)
MAX_PPL_RISE = 0.03
MIN_TOP1 = 0.80


def _passage_logits(path: str, ids: list[int], quantize: bool) -> torch.Tensor:
    groups = ParallelGroups.single()
    hf_config, model = cp_moe_driver.load_model(path, groups)
    if quantize:
        assert quantize_online(model, "w8a8_int8") == 4 * hf_config.num_hidden_layers
        pack_quantized_linears(model)  # the fused CPU kernel where the build has it (same bits)
    h = cp_moe_driver.make_harness(hf_config, model, groups, "zigzag")
    step = cp_moe_driver.pp_stepper(h, model, groups, [])
    return step([(h.new_request(), ids)], all_logits=True).clone()


def _perplexity(logits: torch.Tensor, ids: list[int]) -> float:
    logp = torch.log_softmax(logits[:-1].float(), dim=-1)
    return float(torch.exp(-logp.gather(1, torch.tensor(ids[1:])[:, None]).mean()))


def test_w8a8_smollm2_perplexity_and_top1_against_float32():
    gguf = find_default_model()
    ids = get_tokenizer(gguf).encode(PASSAGE, add_special_tokens=False)
    hf_dir = cached_hf_dir(gguf)
    ref, ours = _passage_logits(hf_dir, ids, False), _passage_logits(hf_dir, ids, True)
    ppl_ref, ppl = _perplexity(ref, ids), _perplexity(ours, ids)
    top1 = float((ours.argmax(-1) == ref.argmax(-1)).float().mean())
    print(f"perplexity float32 {ppl_ref:.3f}, w8a8 {ppl:.3f} ({ppl / ppl_ref - 1:+.1%}); top-1 {top1:.1%}")
    assert ppl <= ppl_ref * (1 + MAX_PPL_RISE), (ppl, ppl_ref)
    assert top1 >= MIN_TOP1, top1
