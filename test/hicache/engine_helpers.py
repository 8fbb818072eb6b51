"""Shared by the HiCache engine tests (tiny Llama, dummy float32 weights): a multi-turn workload
and one engine run over it."""

from __future__ import annotations

import json

import torch

import sglang as sgl
from sglang.test.tiny_models import TINY_LLAMA_DIR

POOL = 128  # KV pool tokens (per replica)
PAGE = 4
GREEDY = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}


def conversation_turns(seed: int, convs: int, base: int = 40, turns: int = 3) -> list[list[list[int]]]:
    """`turns` waves of `convs` prompts: each turn appends 8 tokens to its conversation's history."""
    g = torch.Generator().manual_seed(seed)
    hist = [torch.randint(3, 500, (base,), generator=g).tolist() for _ in range(convs)]
    out = []
    for _ in range(turns):
        hist = [h + torch.randint(3, 500, (8,), generator=g).tolist() for h in hist]
        out.append([list(h) for h in hist])
    return out


def tiny_engine(**kw) -> sgl.Engine:
    """The tiny Llama engine of these tests (float32 dummy weights, a KV pool of POOL tokens); `kw`
    adds flags or overrides these (another model_path and load_format)."""
    args = dict(
        model_path=str(TINY_LLAMA_DIR),
        load_format="dummy",
        dtype="float32",
        page_size=PAGE,
        max_total_tokens=POOL,
        num_threads=1,
        log_level="warning",
    )
    return sgl.Engine(**{**args, **kw})


def run_engine(waves: list[list[list[int]]], hicache_dir=None, page_tokens: int = 8, **kw):
    """Generate each wave as one batch; (output ids, cached tokens per prompt, every replica's
    internal state). `hicache_dir`: HiCache on, with the file backend in that directory."""
    if hicache_dir is not None:
        kw.setdefault("hicache_storage_prefetch_policy", "wait_complete")  # every stored page
        kw.update(
            enable_hierarchical_cache=True,
            hicache_storage_backend="file",
            hicache_storage_backend_extra_config=json.dumps(
                {"file_path": hicache_dir, "page_tokens": page_tokens}
            ),
        )
    with tiny_engine(**kw) as llm:
        res = [r for wave in waves for r in llm.generate(input_ids=wave, sampling_params=GREEDY)]
        states = llm.get_server_info()["internal_states"]
    return [r["output_ids"] for r in res], [r["meta_info"]["cached_tokens"] for r in res], states


def check_restart(ps, expected, again, cached, state: dict, storage_page: int) -> None:
    """A restarted engine's run over `ps`: the tokens of `expected`, every whole storage page of
    each prompt loaded, only the suffixes computed, no page missing on another stage, the pool free."""
    assert again == expected
    assert cached == [(len(p) - 1) // storage_page * storage_page for p in ps]
    assert state["prefill_tokens_computed"] == sum(len(p) - c for p, c in zip(ps, cached))
    assert state["hicache_peer_missing_pages"] == 0
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]
