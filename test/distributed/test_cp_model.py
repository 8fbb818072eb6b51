"""Tiny Llama and Qwen3 under context parallelism (cp = 2 and 4 gloo ranks, tp = cp, attn_tp = 1)
vs the single-rank model, driven directly on hand-built batches (CPForwardHarness), float32.

Workload: 3 prompts of odd lengths prefilled in chunks of 8 (the 30-token prompt over 4 chunks,
the later ones over a cached prefix) while the finished prompts decode, then greedy decoding to
32 tokens each, and a 4th request that reuses the first 16 tokens of the long prompt (radix hit).
Both split strategies; logits of every step within 1e-4 of cp = 1 and the greedy tokens identical;
each rank stores about 1/cp of the KV. pp = 2 × cp = 2 (4 ranks): stage 0 sends its sharded
hidden states / residual to the stage-1 rank with the same cp rank; same parity requirement.
"""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.srt.models.registry import ModelRegistry
from sglang.test.cp_forward_helpers import CPForwardHarness, pp_stepper
from sglang.test.tiny_models import TINY_LLAMA_DIR, TINY_QWEN3_DIR, write_random_checkpoint
from sglang.test.greedy_loop import chunked_greedy

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

TOL = 1e-4
PROMPT_LENS = (7, 19, 30)
CHUNK = 8
NEW_TOKENS = 32
SHARED = 16  # radix-hit prefix: whole virtual pages for every cp size tested
MODELS = {"llama": TINY_LLAMA_DIR, "qwen3": TINY_QWEN3_DIR}
RUNS = [("llama", "zigzag"), ("llama", "round-robin"), ("qwen3", "zigzag")]


def generate(path: str, groups: ParallelGroups, strategy: str) -> dict:
    hf_config = ModelConfig(path).hf_config
    model = ModelRegistry.resolve(hf_config.architectures)(hf_config, groups, torch.float32).eval()
    model.load_weights(iter_safetensors_weights(path))
    h = CPForwardHarness(hf_config, groups.attn_cp, strategy, max_total_tokens=1024)
    proxy_rows: list[tuple[int, int]] = []  # (rows sent to the next stage, tokens in the batch)

    step = pp_stepper(h, model, groups, proxy_rows)

    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, hf_config.vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    reqs = [h.new_request() for _ in prompts]
    outputs, step_logits = chunked_greedy(step, reqs, prompts, NEW_TOKENS, CHUNK)
    # radix hit: reuse the long prompt's first SHARED tokens, prefill the rest in one go
    hit = h.new_request(share_prefix_of=reqs[2], prefix_len=SHARED)
    hit_prompt = prompts[2][SHARED:] + prompts[0]
    step_logits.append(step([(hit, hit_prompt)], all_logits=True).clone())
    return {"tokens": outputs, "logits": step_logits, "rows": h.stored_rows(), "proxy_rows": proxy_rows}


def _rank_body(rank: int, world_size: int, paths: dict[str, str]) -> list[dict]:
    groups = ParallelGroups.build(ParallelLayout(tp=world_size, attn_cp=world_size), rank)
    return [generate(paths[name], groups, strategy) for name, strategy in RUNS]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cp_ckpt")
    return {name: write_random_checkpoint(src, str(root / name), seed=11) for name, src in MODELS.items()}


@pytest.fixture(scope="module")
def reference(checkpoints) -> dict[str, dict]:
    single = ParallelGroups.single()
    return {name: generate(path, single, "zigzag") for name, path in checkpoints.items()}


def test_reference_is_not_degenerate(reference):
    for name in MODELS:
        tokens = reference[name]["tokens"]
        assert all(len(t) == NEW_TOKENS for t in tokens)
        assert len({tuple(t) for t in tokens}) == 3 and all(len(set(t)) > 3 for t in tokens)
        assert len(reference[name]["logits"]) == 4 + NEW_TOKENS - 1 + 1


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_model_matches_single_rank(cp, checkpoints, reference):
    results = run_ranks(_rank_body, cp, args=(checkpoints,), timeout=180)
    for run, (name, strategy) in enumerate(RUNS):
        ref = reference[name]
        for rank in range(cp):
            got = results[rank][run]
            assert got["tokens"] == ref["tokens"], (name, strategy, rank)
            assert len(got["logits"]) == len(ref["logits"])
            for step, (a, b) in enumerate(zip(got["logits"], ref["logits"])):
                torch.testing.assert_close(
                    a,
                    b,
                    atol=TOL,
                    rtol=0,
                    msg=lambda m: f"{name} {strategy} cp={cp} rank {rank} step {step}: {m}",
                )
        rows = [results[r][run]["rows"] for r in range(cp)]
        assert sum(rows) == ref["rows"], (name, strategy, rows)  # each token stored once
        assert max(rows) <= -(-ref["rows"] // cp) + 4, (name, strategy, rows)


def _pp_cp_rank_body(rank: int, world_size: int, path: str) -> dict:
    groups = ParallelGroups.build(ParallelLayout(pp=2, tp=2, attn_cp=2), rank)
    assert groups.attn_cp.size == 2 and groups.pp.size == 2
    return generate(path, groups, "zigzag")


def test_pp2_cp2_matches_single_rank(checkpoints, reference):
    results = run_ranks(_pp_cp_rank_body, 4, args=(checkpoints["llama"],), timeout=180)
    ref = reference["llama"]
    for rank, got in enumerate(results):
        assert got["tokens"] == ref["tokens"], rank
        for step, (a, b) in enumerate(zip(got["logits"], ref["logits"])):
            torch.testing.assert_close(
                a, b, atol=TOL, rtol=0, msg=lambda m: f"pp2 cp2 rank {rank} step {step}: {m}"
            )
    # proxies stay sharded: on a prefill step each stage-0 rank sends only its share of the tokens
    for rank in (0, 1):  # stage 0
        sent = results[rank]["proxy_rows"]
        assert sent[0][0] < sent[0][1] and all(r <= n for r, n in sent)
    # the stages hold disjoint layers; the two cp ranks of a stage split that stage's KV
    assert results[0]["rows"] + results[1]["rows"] == ref["rows"]


SHARDED = ("model.embed_tokens", "lm_head", "model.layers.0.self_attn.o_proj")


def _dense_tp_rank_body(rank: int, world_size: int, path: str) -> dict:
    """cp 2 with the embedding / LM head vocab-sharded over the cp group (`--enable-cp-dense-tp`)."""
    groups = ParallelGroups.build(ParallelLayout(tp=2, attn_cp=2, cp_dense_tp=True), rank)
    out = generate(path, groups, "zigzag")
    hf_config = ModelConfig(path).hf_config
    model = ModelRegistry.resolve(hf_config.architectures)(hf_config, groups, torch.float32)
    out["bytes"] = {name: _bytes(getattr_path(model, name)) for name in SHARDED}
    return out


def _bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def getattr_path(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def test_cp_dense_tp_matches_single_rank(checkpoints, reference):
    """Tokens identical and logits within 1e-4 of cp 1 (split decodes: the LM head's vocab slices
    moved to the rows' holders; all-token logits: the head's own gather; o_proj row-parallel over
    the cp ranks), each rank holding 1/cp of the embedding, LM head and o_proj bytes."""
    results = run_ranks(_dense_tp_rank_body, 2, args=(checkpoints["llama"],), timeout=180)
    ref = reference["llama"]
    hf_config = ModelConfig(checkpoints["llama"]).hf_config
    full = ModelRegistry.resolve(hf_config.architectures)(hf_config, ParallelGroups.single(), torch.float32)
    for rank, got in enumerate(results):
        assert got["tokens"] == ref["tokens"], rank
        for step, (a, b) in enumerate(zip(got["logits"], ref["logits"])):
            torch.testing.assert_close(
                a, b, atol=TOL, rtol=0, msg=lambda m: f"dense tp rank {rank} step {step}: {m}"
            )
        vocab = hf_config.vocab_size
        for name, nbytes in got["bytes"].items():
            whole = _bytes(getattr_path(full, name))
            # 1/cp: the vocabulary rows (padded to a multiple of cp), o_proj's input columns
            expected = whole // 2 if "o_proj" in name else -(-vocab // 2) * (whole // vocab)
            assert nbytes == expected and nbytes < whole, name
