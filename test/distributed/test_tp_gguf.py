"""The SmolLM2 GGUF (9 heads, 3 KV heads) sharded over tp=3: dequantized GGUF weights go through
each parameter's weight_loader, and greedy ids equal the single-rank reference ids."""

from __future__ import annotations

import pytest

import sglang as sgl

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

PROMPT_IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is"
REFERENCE = [7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34, 32, 33]  # tp=1, transformers, vLLM


def test_gguf_tp3_matches_reference():
    with sgl.Engine(tp_size=3, dtype="float32", max_total_tokens=2048, log_level="warning") as llm:
        out = llm.generate(input_ids=PROMPT_IDS, sampling_params={"max_new_tokens": 12, "temperature": 0})
    assert out["output_ids"] == REFERENCE


def test_gguf_tp2_is_a_clear_error():
    with pytest.raises(Exception, match="divisible|multiple"):
        sgl.Engine(tp_size=2, dtype="float32", max_total_tokens=2048, log_level="error")
