"""HiCache through the whole engine at tp 2 (one scheduler process per rank, gloo): a multi-turn
workload whose KV is several times the KV pool gives the greedy tokens of tp 1 without HiCache;
then a new engine on the same file directory loads the prefixes from storage on both ranks (the
ranks agree on how many pages they load) and computes only the suffix."""

from __future__ import annotations

import json

import pytest
import torch

import sglang as sgl
from sglang.test.tiny_models import TINY_LLAMA_DIR

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

POOL = 128
PAGE = 4


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    hist = [torch.randint(3, 500, (40,), generator=g).tolist() for _ in range(3)]
    out = []
    for _ in range(3):
        for k in range(3):
            hist[k] = hist[k] + torch.randint(3, 500, (8,), generator=g).tolist()
            out.append(list(hist[k]))
    return out


def run(tp: int, hicache_dir=None) -> tuple[list[list[int]], dict]:
    hicache = {}
    if hicache_dir is not None:
        hicache = dict(
            enable_hierarchical_cache=True,
            hicache_storage_backend="file",
            hicache_storage_backend_extra_config=json.dumps({"file_path": hicache_dir, "page_tokens": 8}),
        )
    params = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    with sgl.Engine(
        model_path=str(TINY_LLAMA_DIR),
        load_format="dummy",
        dtype="float32",
        tp_size=tp,
        page_size=PAGE,
        max_total_tokens=POOL,
        num_threads=1,
        log_level="warning",
        **hicache,
    ) as llm:
        outs = [llm.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts()]
        state = llm.get_server_info()["internal_states"][0]
    return outs, state


def test_tp2_hicache_matches_and_restarts_from_files(tmp_path):
    ps = prompts()
    assert sum(len(p) for p in ps) > 3 * POOL
    ref, _ = run(1)
    d = str(tmp_path / "kv")
    got, state = run(2, d)
    assert got == ref
    assert (
        state["hicache_l2_hit_tokens"] > 0 and state["available_kv_tokens"] == state["max_total_num_tokens"]
    )
    again, state = run(2, d)  # a restarted server: empty L1 and L2, the files remain
    assert again == ref
    assert state["hicache_l3_hit_tokens"] > 0 and state["hicache_storage_read_failures"] == 0
    assert state["prefill_tokens_computed"] < sum(len(p) for p in ps) // 2
