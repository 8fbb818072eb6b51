"""The `dsa` backend with int8 index scoring (`SGLANG_DSA_INDEX_SCORE_DTYPE=int8`) on tiny
DeepSeek-V3.2 (float32 model, index_topk 8, one process, the CP test driver's prompts: chunked
prefill, decode, a radix-hit prefix).

- Top-k overlap on the model's own activations: during a float32-scored run, every paged selection
  is recomputed with int8 scoring on the same inputs; measured mean 0.99 (93 % of rows identical,
  worst row 6 of 8): asserted mean >= 0.97, at least 85 % of rows identical.
- Tokens: the int8-scored run generates; its first (prefill) token equals the float32 run's for
  every prompt (measured: the first 5, 5 and 4 of 12 greedy tokens agree, then this random tiny
  model's near-tied logits diverge), and int8 scoring did change the logits (the setting took
  effect).
- cp = 2 (zigzag: own-query indexer over the gathered rows, quantized in the call; decode
  candidates from each rank's shard of the pool's int8 copy) gives cp = 1's greedy tokens and
  logits within 1e-4: every path quantizes each key row the same way.
- The pool's int8 index-key copy (quantized once, when written; `SGLANG_DSA_INDEX_SCORE_DTYPE=int8`
  creates it) is what the backend scores, and it gives exactly the tokens and logits of quantizing
  the pool-dtype keys in every indexer call.
"""

from __future__ import annotations

import pytest
import torch

from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.attention.dsa.backend_names import INDEX_SCORE_DTYPE_ENV
from sglang.srt.layers.attention.dsa.kernels import DSAKernels
from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool
from sglang.test.cp_moe_driver import generate
from sglang.test.tiny_moe_models import save_tiny_v32
from test_dsa_backend_bf16_scoring import _cp2, run_ranks  # the cp = 2 run of the same driver, its spawner

pytestmark = pytest.mark.slow  # six tiny-model generations and a 2-rank run (15-40 s on 2 cores)

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return save_tiny_v32(tmp_path_factory.mktemp("dsa_int8_ckpt") / "v32")


def _run(path: str) -> dict:
    return generate(path, ParallelGroups.single(), "zigzag", NEW_TOKENS, attention_backend="dsa")


def test_int8_scoring_topk_overlap_and_tokens(checkpoint, monkeypatch):
    real = DSAKernels.select_paged
    overlaps = []

    # the float32 selection drives the run; int8's on the same inputs is compared

    def both(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        assert self.index_score_dtype is None
        self.index_score_dtype = torch.int8
        try:
            alt = real(self, *args, **kwargs)
        finally:
            self.index_score_dtype = None
        for a, b in zip(out.tolist(), alt.tolist()):
            want = set(a) - {-1}
            if want:
                overlaps.append(len(want & (set(b) - {-1})) / len(want))
        return out

    monkeypatch.setenv(INDEX_SCORE_DTYPE_ENV, "float32")
    monkeypatch.setattr(DSAKernels, "select_paged", both)
    f32 = _run(checkpoint)
    monkeypatch.setattr(DSAKernels, "select_paged", real)
    assert len(overlaps) > 100
    mean, same = sum(overlaps) / len(overlaps), sum(o == 1.0 for o in overlaps) / len(overlaps)
    assert mean >= 0.97 and same >= 0.85, (mean, same, min(overlaps))

    monkeypatch.setenv(INDEX_SCORE_DTYPE_ENV, "int8")
    i8 = _run(checkpoint)
    assert len(i8["tokens"]) == len(f32["tokens"]) and all(len(t) == NEW_TOKENS for t in i8["tokens"])
    assert [t[0] for t in i8["tokens"]] == [t[0] for t in f32["tokens"]]
    assert any(not torch.equal(a, b) for a, b in zip(i8["logits"], f32["logits"]))


def test_int8_key_copy_matches_quantizing_in_the_call(checkpoint, monkeypatch):
    monkeypatch.setenv(INDEX_SCORE_DTYPE_ENV, "int8")
    scales = []
    real = DSAKernels.select_paged

    def spy(self, *args, **kwargs):
        scales.append(args[-1] if len(args) > 9 else kwargs.get("index_k_scale"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DSAKernels, "select_paged", spy)
    cached = _run(checkpoint)
    assert scales and all(s is not None for s in scales)  # the backend read the pool's int8 copy
    monkeypatch.setattr(DSATokenToKVPool, "get_index_k_int8", lambda self, layer_id: None)
    scales.clear()
    in_call = _run(checkpoint)
    assert scales and all(s is None for s in scales)
    assert cached["tokens"] == in_call["tokens"]
    assert all(torch.equal(a, b) for a, b in zip(cached["logits"], in_call["logits"]))


def test_int8_scoring_cp2_matches_cp1(checkpoint, monkeypatch):
    monkeypatch.setenv(INDEX_SCORE_DTYPE_ENV, "int8")  # inherited by the spawned ranks
    one = _run(checkpoint)
    for rank, got in enumerate(run_ranks(_cp2, 2, args=(checkpoint,), timeout=500)):
        assert got["tokens"] == one["tokens"], rank
        for step, (a, b) in enumerate(zip(got["logits"], one["logits"])):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0, msg=lambda m: f"rank {rank} step {step}: {m}")
