"""End to end, `sgl.Engine` from other model sources: a Hugging Face model id served from an HF
cache with the network off (refs/main, and `--revision` picking a second snapshot), and a torch
`.bin` checkpoint (`--load-format pt`) giving the greedy tokens of its safetensors copy."""

from __future__ import annotations

import os
import sys

import pytest

import sglang as sgl
from sglang.test.bin_checkpoints import safetensors_to_bin

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "unit"))
from test_hf_model_id import MODEL_ID, V2_HASH, write_hf_cache  # noqa: E402

pytestmark = pytest.mark.slow  # starts engines

PROMPTS = ["Hello world", "The capital of France is"]
GREEDY = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}


def _greedy(**kw) -> tuple[list[list[int]], dict]:
    engine = sgl.Engine(dtype="float32", log_level="warning", **kw)
    try:
        outs = engine.generate(PROMPTS, GREEDY)
        return [o["output_ids"] for o in outs], engine.server_args
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf-hub")
    return str(cache), write_hf_cache(cache)


@pytest.fixture(scope="module")
def main_tokens(hf_cache):
    """The id at refs/main, with the network off: loads the cached safetensors snapshot."""
    cache, snaps = hf_cache
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("HF_HUB_CACHE", cache)
    try:
        tokens, args = _greedy(model_path=MODEL_ID)
    finally:
        mp.undo()
    assert args.model_path == snaps["main"] and args.tokenizer_path == snaps["main"]
    assert args.served_model_name == MODEL_ID
    assert all(len(t) == GREEDY["max_new_tokens"] for t in tokens)
    return tokens


def test_model_id_from_cache_offline(main_tokens):
    # generated from the id (the fixture checked it resolved to the cached snapshot); the pt test
    # below checks these tokens against the same weights read from another format
    assert len(main_tokens) == len(PROMPTS) and main_tokens[0] != main_tokens[1]


def test_revision_picks_second_snapshot(main_tokens, hf_cache, monkeypatch):
    cache, snaps = hf_cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    tokens, args = _greedy(model_path=MODEL_ID, revision=V2_HASH)
    assert args.model_path == snaps["v2"]
    assert tokens != main_tokens  # seed 1's weights, not seed 0's


def test_load_format_pt_matches_safetensors(main_tokens, hf_cache, tmp_path):
    bin_dir = safetensors_to_bin(hf_cache[1]["main"], str(tmp_path / "bin"), shards=2)
    tokens, _ = _greedy(model_path=bin_dir, load_format="pt")
    assert tokens == main_tokens
