"""The `dsa` backend with bf16 index scoring (`SGLANG_DSA_INDEX_SCORE_DTYPE=bfloat16`) on tiny
DeepSeek-V3.2, float32 model, through the CP test driver: cp = 2 (zigzag: own-query indexer over
the gathered rows, decode candidates from each rank's shard merged into the global top-k) gives the
greedy tokens of cp = 1 and logits within 1e-4, because every path rounds the same query and keys to
bf16 and scores each key the same way. (The float32 reference backend is NOT the oracle here: bf16
scores reorder near-equal keys at the top-k boundary, and on this random tiny model with
index_topk 8 that changes tokens; the float32 path's parity with the reference is
test/distributed/test_dsa_backend_parity.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from dist_spawn import run_ranks  # noqa: E402
from sglang.srt.distributed.parallel_layout import ParallelLayout  # noqa: E402
from sglang.srt.distributed.parallel_state import ParallelGroups  # noqa: E402
from sglang.srt.layers.attention.dsa.backend_names import INDEX_SCORE_DTYPE_ENV  # noqa: E402
from sglang.test.cp_moe_driver import generate  # noqa: E402
from sglang.test.tiny_moe_models import save_tiny_v32  # noqa: E402

pytestmark = pytest.mark.slow  # spawns gloo ranks

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return save_tiny_v32(tmp_path_factory.mktemp("dsa_bf16_ckpt") / "v32")


def _cp2(rank: int, world_size: int, path: str) -> dict:
    groups = ParallelGroups.build(ParallelLayout(tp=2, attn_cp=2), rank)
    return generate(path, groups, "zigzag", NEW_TOKENS, attention_backend="dsa")


def test_bf16_scoring_cp2_matches_cp1(checkpoint, monkeypatch):
    monkeypatch.setenv(INDEX_SCORE_DTYPE_ENV, "float32")
    f32 = generate(checkpoint, ParallelGroups.single(), "zigzag", NEW_TOKENS, attention_backend="dsa")
    monkeypatch.setenv(INDEX_SCORE_DTYPE_ENV, "bfloat16")  # inherited by the spawned ranks
    one = generate(checkpoint, ParallelGroups.single(), "zigzag", NEW_TOKENS, attention_backend="dsa")
    # the setting takes effect: bf16 scores select other keys somewhere on this model
    assert any(not torch.equal(a, b) for a, b in zip(one["logits"], f32["logits"]))
    for rank, got in enumerate(run_ranks(_cp2, 2, args=(checkpoint,), timeout=500)):
        assert got["tokens"] == one["tokens"], rank
        for step, (a, b) in enumerate(zip(got["logits"], one["logits"])):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0, msg=lambda m: f"rank {rank} step {step}: {m}")
