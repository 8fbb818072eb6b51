"""The segmented prefix KV gather (`--cp-kv-gather-segment`) scores the DSA indexer at the `dsa`
backend's chosen precision (`SGLANG_DSA_INDEX_SCORE_DTYPE`: bfloat16 / int8), like the unsegmented
CP path, instead of the float32 reference.

- In process: a long prefix cut into rounds of 7 keys plus a chunk scored causally; the rounds'
  candidates (`DSAKernels.range_topk_candidates`) merged in the selection's order give exactly the
  top-k of the whole sequence at the same precision (`own_query_topk`, the unsegmented path). The
  data is chosen so that int8 scoring selects other keys than float32 does: the float32 reference
  merged over the same rounds does not match (what the segmented path did before).
- 2 gloo ranks (tiny DeepSeek-V3.2, float32, `dsa` backend, index_topk 8), test_cp_segmented_gather's
  workload (a 50-token prompt prefilled in chunks of 12 beside a 9-token one, greedy decoding, then
  two radix hits): with each setting, segment 7 gives the tokens of the unsegmented cp 2 run and of
  cp 1, logits within 1e-4 (before, segment 7 under int8 / bfloat16 did not).
"""

from __future__ import annotations

import os

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.attention import mla_cp_segments as seg
from sglang.srt.layers.attention.dsa.backend_names import INDEX_SCORE_DTYPE_ENV
from sglang.srt.layers.attention.dsa.kernels import DSAKernels
from sglang.test.tiny_moe_models import deepseek_v32_config, save_random_model
from test_cp_segmented_gather import generate  # the segmented-gather workload, on one backend

TOL = 1e-4
SEGMENT = 7
SETTINGS = ["bfloat16", "int8"]
DTYPES = {"bfloat16": torch.bfloat16, "int8": torch.int8}


def _rounds(kernels, q, w, keys, prefix: int, q_pos, topk: int) -> torch.Tensor:
    """Positions selected by the segmented path's candidate merge, sorted."""
    acc = None
    for a in range(0, prefix, SEGMENT):
        part = seg._candidates(kernels, q, w, keys[a : min(prefix, a + SEGMENT)], a, topk, 0.3)
        acc = seg._merge_candidates(acc, part, topk)
    part = seg._candidates(kernels, q, w, keys[prefix:], prefix, topk, 0.3, q_pos)
    return seg._merge_candidates(acc, part, topk)[1].sort(dim=1).values


@pytest.mark.parametrize("impl", ["reference", "cpu"])
@pytest.mark.parametrize("setting", SETTINGS)
def test_rounds_select_what_the_whole_sequence_selects(impl, setting):
    g = torch.Generator().manual_seed(0)
    m, heads, dim, prefix, new, topk = 5, 4, 32, 400, 9, 8
    q, w = torch.randn(m, heads, dim, generator=g), torch.randn(m, heads, generator=g)
    keys = torch.randn(prefix + new, dim, generator=g)
    q_pos = torch.tensor([1, 2, 5, 7, 8]) + prefix
    kernels = DSAKernels(impl, impl, DTYPES[setting])
    whole = kernels.own_query_topk(q, w, q_pos, keys, topk, 0.3).long().sort(dim=1).values
    assert torch.equal(_rounds(kernels, q, w, keys, prefix, q_pos, topk), whole)
    if setting == "int8":  # the float32 reference over the same rounds selects other keys
        assert not torch.equal(_rounds(None, q, w, keys, prefix, q_pos, topk), whole)


def _with_setting(setting: str, fn, *args):
    old = os.environ.get(INDEX_SCORE_DTYPE_ENV)
    os.environ[INDEX_SCORE_DTYPE_ENV] = setting
    try:
        return fn(*args)
    finally:
        if old is None:
            os.environ.pop(INDEX_SCORE_DTYPE_ENV)
        else:
            os.environ[INDEX_SCORE_DTYPE_ENV] = old


def _body(rank: int, world_size: int, path: str) -> dict:
    groups = ParallelGroups.build(ParallelLayout(tp=2, attn_cp=2), rank)
    return {
        (s, n): _with_setting(s, generate, path, groups, n, "dsa") for s in SETTINGS for n in (SEGMENT, 0)
    }


@pytest.mark.slow  # spawns gloo ranks
def test_segmented_gather_scores_at_the_chosen_precision(tmp_path):
    path = str(tmp_path / "v32")
    save_random_model(deepseek_v32_config(index_topk=8), path, seed=11)
    ref = {s: _with_setting(s, generate, path, ParallelGroups.single(), 0, "dsa") for s in SETTINGS}
    ranks = run_ranks(_body, 2, args=(path,), timeout=500)
    for setting in SETTINGS:
        want = ref[setting]
        assert len({tuple(t) for t in want["tokens"]}) > 2
        for rank, res in enumerate(ranks):
            for segment in (SEGMENT, 0):
                got, tag = res[(setting, segment)], (setting, segment, rank)
                assert got["tokens"] == want["tokens"], tag
                for a, b in zip(got["logits"], want["logits"]):
                    torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=lambda m: f"{tag}: {m}")
