"""`sgl.Engine` on the tiny DeepSeek-V3.2 (dummy float32 weights) with the DSA backend: upstream's spelling
(`--attention-backend nsa` with `--nsa-prefill-backend` / `--nsa-decode-backend`) at cp 1, and
`--attention-backend dsa --cp-size 2 --enable-shard-linear`. Greedy tokens equal the in-process
single-rank reference scheduler's (torch_native backend): a 30-token prompt (longer than index_topk
8: sparse, chunked by 16) and a 5-token one; and int8 index scoring at cp 1 against float32 scoring.

The prefill flag is `reference` here, not one of upstream's GPU names: those select the Triton
kernels, which need a GPU (or TRITON_INTERPRET=1, far too slow for an engine test).
"""

from __future__ import annotations

import pytest
import torch

import sglang as sgl
from sglang.srt.layers.attention.dsa.backend_names import INDEX_SCORE_DTYPE_ENV
from sglang.test.scheduler_harness import SchedulerHarness
from sglang.test.tiny_models import ASSETS_DIR

pytestmark = pytest.mark.slow  # starts engines (2 ranks for cp 2)

TINY_V32 = f"{ASSETS_DIR}/tiny-deepseek-v32"
NEW_TOKENS = 12
PARAMS = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def case():
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 552, (n,), generator=gen).tolist() for n in (30, 5)]
    ref = SchedulerHarness(
        model_path=TINY_V32, load_format="dummy", chunked_prefill_size=16, attention_backend="torch_native"
    )
    rids = [ref.submit(p, NEW_TOKENS) for p in prompts]
    ref.run()
    expected = [ref.outputs[r] for r in rids]
    assert all(len(e) == NEW_TOKENS for e in expected) and expected[0] != expected[1]
    return prompts, expected


@pytest.mark.parametrize(
    "extra",
    [
        dict(attention_backend="nsa", nsa_prefill_backend="reference", nsa_decode_backend="cpu"),
        dict(attention_backend="dsa", cp_size=2, enable_shard_linear=True),
    ],
    ids=["nsa-cp1", "dsa-cp2-shard-linear"],
)
def test_engine_dsa_backend_matches_reference(case, extra):
    prompts, expected = case
    assert _generate(prompts, **extra) == expected


def test_engine_int8_index_scoring(case, monkeypatch):
    """SGLANG_DSA_INDEX_SCORE_DTYPE=int8 (the pool keeps int8 index keys; the indexer scores int8)
    against float32 scoring on the fused CPU kernels (which here gives the reference's tokens).
    Measured: the 5-token prompt's 12 greedy tokens are the same, the 30-token prompt's first 5,
    then its sixth differs (int8 scores pick another key at a near-tie of this dummy model)."""
    prompts, expected = case
    monkeypatch.setenv(INDEX_SCORE_DTYPE_ENV, "float32")  # inherited by the scheduler process
    f32 = _generate(prompts, attention_backend="dsa")
    assert f32 == expected
    monkeypatch.setenv(INDEX_SCORE_DTYPE_ENV, "int8")
    i8 = _generate(prompts, attention_backend="dsa")
    assert [len(t) for t in i8] == [NEW_TOKENS] * 2
    assert i8[1] == f32[1] and i8[0][:5] == f32[0][:5]


def _generate(prompts, **extra) -> list:
    engine = sgl.Engine(
        model_path=TINY_V32,
        load_format="dummy",
        dtype="float32",
        log_level="warning",
        chunked_prefill_size=16,
        **extra,
    )
    try:
        return [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=PARAMS)]
    finally:
        engine.shutdown()
