"""Context parallelism for DeepSeek-V3.2 (MLA + DSA), DeepSeek-V3 (MLA) and Qwen3-MoE on gloo ranks vs
the single-rank model, driven on hand-built batches (`sglang.test.cp_moe_driver`), float32.

Workload per run: prompts of 7, 19 and 30 tokens prefilled in chunks of 12 beside decodes (the
30-token one over 3 chunks), 16 greedy tokens each, then a radix-cache hit next to a fresh prompt
(all logits). V3.2's index_topk is 8, so attention is sparse on every step but the first and the
first chunks are sparse fresh prefills. Greedy tokens identical and every step's logits within
1e-4 of cp = 1; every latent row is stored on exactly one cp rank.

Layouts: cp 2 (zigzag, round-robin; plus ep 2), cp 4 (both strategies, page 2 / interleave 2 for
some runs), pp 2 x cp 2, tp 4 with cp 2 (attn_tp 2). One spawn per world size runs several layouts.
The zero-redundant indexer: at cp 2 each rank scores only its own prefill queries (rows sum to the
cp 1 count, each rank about half) and only its shard of the keys for decodes (pairs likewise).
"""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.test.cp_moe_driver import generate, score_counts
from sglang.test.tiny_moe_models import (
    deepseek_v3_config,
    deepseek_v32_config,
    qwen3_moe_config,
    save_random_model,
)

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

TOL = 1e-4
NEW_TOKENS = 16
MODELS = {
    "v32": lambda: deepseek_v32_config(index_topk=8),
    "v3": deepseek_v3_config,
    "qwen3moe": qwen3_moe_config,
}
# (layout name, ParallelLayout kwargs, runs: (model, strategy, page, interleave))
CP2 = [
    ("cp2", dict(tp=2, attn_cp=2), [(m, s, 1, 1) for m in MODELS for s in ("zigzag", "round-robin")]),
    (
        "cp2-ep2",
        dict(tp=2, attn_cp=2, moe_ep=2),
        [("v32", "zigzag", 1, 1), ("qwen3moe", "round-robin", 1, 1)],
    ),
]
CP4 = [
    (
        "cp4",
        dict(tp=4, attn_cp=4),
        [
            ("v32", "zigzag", 2, 2),
            ("v32", "round-robin", 1, 1),
            ("v3", "zigzag", 1, 1),
            ("v3", "round-robin", 2, 2),
            ("qwen3moe", "zigzag", 1, 1),
            ("qwen3moe", "round-robin", 2, 2),
        ],
    ),
    ("tp4-cp2", dict(tp=4, attn_cp=2, moe_ep=2), [("v32", "zigzag", 1, 1), ("qwen3moe", "zigzag", 1, 1)]),
]
PP2CP2 = [
    (
        "pp2-cp2",
        dict(pp=2, tp=2, attn_cp=2),
        [(m, "zigzag", 1, 1) for m in MODELS] + [("v32", "round-robin", 1, 1)],
    )
]


def _body(rank: int, world_size: int, paths: dict[str, str], layouts: list, counts: bool) -> dict:
    out: dict = {}
    for name, sizes, runs in layouts:
        groups = ParallelGroups.build(ParallelLayout(**sizes), rank)
        out[name] = [generate(paths[m], groups, s, NEW_TOKENS, page, inter) for m, s, page, inter in runs]
        if counts and name == "cp2":
            out["counts"] = score_counts(paths["v32"], groups)
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cp_moe_ckpt")
    paths = {}
    for name, make in MODELS.items():
        paths[name] = str(root / name)
        save_random_model(make(), paths[name], seed=11)
    return paths


@pytest.fixture(scope="module")
def reference(checkpoints) -> dict:
    single = ParallelGroups.single()
    ref = {name: generate(path, single, "zigzag", NEW_TOKENS) for name, path in checkpoints.items()}
    ref["counts"] = score_counts(checkpoints["v32"], single)
    return ref


@pytest.fixture(scope="module")
def cp2_results(checkpoints) -> list[dict]:
    return run_ranks(_body, 2, args=(checkpoints, CP2, True), timeout=400)


def _check(results: list[dict], layouts: list, reference: dict) -> None:
    for name, sizes, runs in layouts:
        for run, (model, strategy, page, inter) in enumerate(runs):
            ref = reference[model]
            tag = f"{name} {model} {strategy} page={page} interleave={inter}"
            for rank, res in enumerate(results):
                got = res[name][run]
                assert got["tokens"] == ref["tokens"], (tag, rank)
                assert len(got["logits"]) == len(ref["logits"])
                for step, (a, b) in enumerate(zip(got["logits"], ref["logits"])):
                    torch.testing.assert_close(
                        a, b, atol=TOL, rtol=0, msg=lambda m: f"{tag} rank {rank} step {step}: {m}"
                    )
            cp = sizes["attn_cp"]
            attn_tp = sizes["tp"] // cp
            # each latent / KV row on exactly one cp rank (attn_tp peers hold the same rows)
            stage0 = [results[r][name][run]["rows"] for r in range(0, sizes["tp"], attn_tp)]
            assert sum(stage0) == ref["rows"], (tag, stage0)
            assert max(stage0) <= -(-ref["rows"] // cp) + 5 * page, (tag, stage0)  # 5 requests


def test_reference_is_not_degenerate(reference):
    for name in MODELS:
        tokens = reference[name]["tokens"]
        assert all(len(t) == NEW_TOKENS for t in tokens)
        assert len({tuple(t) for t in tokens}) == 3 and all(len(set(t)) > 3 for t in tokens), name
    counts = reference["counts"]
    assert counts["prefill"]["rows"] == 40 * counts["layers"] and counts["decode"]["pairs"] > 0


def test_cp2_matches_single_rank(cp2_results, reference):
    _check(cp2_results, CP2, reference)


def test_cp2_indexer_scores_only_own_work(cp2_results, reference):
    """Zero-redundant indexer: prefill score rows and decode score pairs split over the cp ranks."""
    ref = reference["counts"]
    got = [r["counts"] for r in cp2_results]
    assert all(g["tokens"] == ref["tokens"] for g in got)
    rows = [g["prefill"]["rows"] for g in got]
    assert sum(rows) == ref["prefill"]["rows"] and max(rows) <= ref["prefill"]["rows"] // 2 + ref["layers"], (
        rows
    )
    assert sum(g["prefill"]["pairs"] for g in got) == ref["prefill"]["pairs"]
    pairs = [g["decode"]["pairs"] for g in got]
    assert (
        sum(pairs) == ref["decode"]["pairs"] and max(pairs) <= ref["decode"]["pairs"] // 2 + 3 * ref["layers"]
    ), pairs


def test_cp4_matches_single_rank(checkpoints, reference):
    _check(run_ranks(_body, 4, args=(checkpoints, CP4, False), timeout=500), CP4, reference)


def test_pp2_cp2_matches_single_rank(checkpoints, reference):
    results = run_ranks(_body, 4, args=(checkpoints, PP2CP2, False), timeout=400)
    _check(results, PP2CP2, reference)
    for run in range(len(PP2CP2[0][2])):  # proxies stay sharded: stage 0 sends only its share
        for rank in (0, 1):
            sent = results[rank]["pp2-cp2"][run]["proxy_rows"]
            assert sent[0][0] < sent[0][1] and all(r <= n for r, n in sent)
