"""`sgl.Engine` on the tiny DeepSeek-V3.2 config (dummy float32 weights) with `--tp-size 2 --ep-size 2`
and the `torch_native` (reference) backend: the launch path builds the latent/DSA pool, splits the experts
over two ranks, and greedy generation equals the in-process single-rank scheduler's (a 30-token
prompt, longer than index_topk 8, so attention is sparse, chunked by 16; a 5-token one; and a text
prompt, tokenized by the engine and detokenized back to its text).
"""

from __future__ import annotations

import pytest
import torch

import sglang as sgl
from sglang.srt.managers.tokenizer.incremental_detok import decode_ids
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.scheduler_harness import SchedulerHarness
from sglang.test.tiny_models import ASSETS_DIR

pytestmark = pytest.mark.slow  # starts its own servers / engines

TINY_V32 = f"{ASSETS_DIR}/tiny-deepseek-v32"
NEW_TOKENS = 12


def test_engine_tp2_ep2_matches_single_rank():
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 552, (n,), generator=gen).tolist() for n in (30, 5)]
    tokenizer = get_tokenizer(TINY_V32)
    text_prompt = "The capital of France is"
    ref = SchedulerHarness(model_path=TINY_V32, load_format="dummy", chunked_prefill_size=16)
    rids = [ref.submit(p, NEW_TOKENS) for p in prompts]
    text_rid = ref.submit(tokenizer.encode(text_prompt), 4)
    ref.run()
    expected = [ref.outputs[r] for r in rids]
    assert all(len(e) == NEW_TOKENS for e in expected) and expected[0] != expected[1]

    engine = sgl.Engine(
        model_path=TINY_V32,
        load_format="dummy",
        dtype="float32",
        log_level="warning",
        tp_size=2,
        ep_size=2,
        attention_backend="torch_native",
        chunked_prefill_size=16,
    )
    try:
        outs = engine.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True},
        )
        assert [o["output_ids"] for o in outs] == expected
        text = engine.generate(text_prompt, {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True})
        assert text["output_ids"] == ref.outputs[text_rid]
        assert text["text"] == decode_ids(tokenizer, text["output_ids"], True, True)
    finally:
        engine.shutdown()
