"""`--kv-cache-dtype fp8_e4m3` under context parallelism (cp = 2 gloo ranks, float32 models).

Tiny Llama (MHA):
each rank stores its KV shard as stored, 1 byte per value, and the run matches the single-rank
model (torch_native backend) over a float32 pool that rounds K/V through fp8 the same way (the
reference of test/models/test_kv_cache_fp8.py): greedy tokens identical, logits within TOL (the CP parity
tolerance of test_cp_model.py); the single-rank run without rounding differs by more.

Tiny DeepSeek-V3 (dense MLA) and V3.2 (DSA, index_topk 8: sparse): each rank stores its latent
shard in 1 byte; CP attends over the new rows as stored (rounded), like the single-rank path that
reads them back from the pool, so cp 2 matches cp 1 with the same FP8 pool (whose parity with the
rounding reference is test/models/test_kv_cache_fp8.py's), and differs from the float32 pool.
V3.2 also on the `dsa` backend (sgl_kernel_npu's ops on the 1-byte latent rows and FP8 index keys;
the exchanged index keys rounded as stored): cp 2 and cp 1 give the single-rank reference backend's
greedy tokens over the same FP8 pool, logits within TOL.
"""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.srt.models.registry import ModelRegistry
from sglang.test.cp_forward_helpers import CPForwardHarness, pp_stepper
from sglang.test.cp_moe_driver import load_model
from sglang.test.greedy_loop import chunked_greedy
from sglang.test.tiny_models import TINY_LLAMA_DIR, write_random_checkpoint
from sglang.test.tiny_moe_models import deepseek_v3_config, deepseek_v32_config, save_random_model

pytestmark = pytest.mark.slow  # spawns gloo ranks

TOL = 1e-4
FP8 = torch.float8_e4m3fn


class RoundingMHAPool(MHATokenToKVPool):
    """float32 storage of K/V rounded through fp8 (the reference)."""

    def set_kv_buffer(self, layer_id, loc, cache_k, cache_v):
        rnd = lambda x: x.float().to(FP8).to(torch.float32)  # noqa: E731
        super().set_kv_buffer(layer_id, loc, rnd(cache_k), rnd(cache_v))


def generate(path: str, groups: ParallelGroups, pool_kind: str) -> dict:
    hf_config = ModelConfig(path).hf_config
    model = ModelRegistry.resolve(hf_config.architectures)(hf_config, groups, torch.float32).eval()
    model.load_weights(iter_safetensors_weights(path))
    # the reference runs torch_native: like the CP path, it reads a chunk over a cached prefix
    # (its own new rows included) from the pool; the `cpu` backend attends the chunk's fresh k/v
    backend = "torch_native" if groups.attn_cp.size == 1 else None
    h = CPForwardHarness(hf_config, groups.attn_cp, "zigzag", max_total_tokens=512, attention_backend=backend)
    old = h.token_to_kv_pool
    shape = (old.size, old.page_size, torch.float32, old.head_num, old.head_dim, old.layer_num)
    if pool_kind == "fp8":
        h.token_to_kv_pool = MHATokenToKVPool(*shape, kv_dtype=FP8)
    elif pool_kind == "rounding":
        h.token_to_kv_pool = RoundingMHAPool(*shape)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, hf_config.vocab_size, (n,), generator=gen).tolist() for n in (7, 19)]
    reqs = [h.new_request() for _ in prompts]
    tokens, logits = chunked_greedy(pp_stepper(h, model, groups, []), reqs, prompts, 8, 8)
    pool = h.token_to_kv_pool
    return {
        "tokens": tokens,
        "logits": logits,
        "itemsize": pool.k_head_major[0].element_size(),
        "size": pool.size,
    }


def _rank_body(rank: int, world_size: int, paths: dict) -> dict:
    """Both workloads in one spawn: the MHA model, then the MLA / DSA ones."""
    groups = ParallelGroups.build(ParallelLayout(tp=world_size, attn_cp=world_size), rank)
    return {
        "mha": generate(paths["llama"], groups, "fp8"),
        "mla": [generate_mla(p, groups, FP8) for p in paths["mla"]],
        "dsa": generate_mla(paths["mla"][1], groups, FP8, "dsa"),
    }


@pytest.fixture(scope="module")
def cp2(tmp_path_factory) -> tuple[dict, list[dict]]:
    root = tmp_path_factory.mktemp("cp_kv_fp8")
    paths = {"llama": write_random_checkpoint(TINY_LLAMA_DIR, str(root / "llama"), seed=11), "mla": []}
    for name, cfg in (("v3", deepseek_v3_config()), ("v32", deepseek_v32_config(index_topk=8))):
        paths["mla"].append(str(root / name))
        save_random_model(cfg, paths["mla"][-1], seed=11)
    return paths, run_ranks(_rank_body, 2, args=(paths,))


def test_cp2_fp8_kv_matches_rounding_single_rank(cp2):
    paths, results = cp2
    single = ParallelGroups.single()
    ref = generate(paths["llama"], single, "rounding")
    plain = generate(paths["llama"], single, "plain")
    for r in (res["mha"] for res in results):
        assert r["itemsize"] == 1 and r["size"] * 2 <= ref["size"] + 2  # a 1-byte shard of the pool
        assert r["tokens"] == ref["tokens"]
        diff = max(float((a - b).abs().max()) for a, b in zip(r["logits"], ref["logits"]))
        assert diff <= TOL, f"cp 2 fp8 vs rounding reference: {diff}"
    rounding = max(float((a - b).abs().max()) for a, b in zip(plain["logits"], ref["logits"]))
    assert rounding > 10 * TOL


def generate_mla(path: str, groups: ParallelGroups, kv_dtype, backend=None) -> dict:
    hf_config, model = load_model(path, groups)
    h = CPForwardHarness(hf_config, groups.attn_cp, "zigzag", max_total_tokens=512, attention_backend=backend)
    size = h.mapping.physical_pool_size(h.allocator.size)
    h.token_to_kv_pool = model.create_kv_pool(size, 1, torch.float32, "cpu", kv_dtype)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, hf_config.vocab_size, (n,), generator=gen).tolist() for n in (7, 19)]
    reqs = [h.new_request() for _ in prompts]
    tokens, logits = chunked_greedy(pp_stepper(h, model, groups, []), reqs, prompts, 8, 8)
    return {"tokens": tokens, "logits": logits, "dtype": str(h.token_to_kv_pool.kv_buffer[0].dtype)}


def test_cp2_fp8_latent_cache_matches_single_rank(cp2):
    paths, results = cp2
    single = ParallelGroups.single()
    refs = [generate_mla(p, single, FP8) for p in paths["mla"]]
    for rank_runs in (res["mla"] for res in results):
        for got, ref in zip(rank_runs, refs):
            assert got["dtype"] == "torch.float8_e4m3fn" and got["tokens"] == ref["tokens"]
            diff = max(float((a - b).abs().max()) for a, b in zip(got["logits"], ref["logits"]))
            assert diff <= TOL, f"cp 2 vs cp 1 with an fp8 latent cache: {diff}"
    wide = generate_mla(paths["mla"][0], single, None)
    assert max(float((a - b).abs().max()) for a, b in zip(wide["logits"], refs[0]["logits"])) > 10 * TOL


def test_cp2_dsa_backend_on_fp8_cache_matches_reference_backend(cp2):
    """V3.2 on `dsa` with FP8 latent rows and index keys: cp 2 and cp 1 against the single-rank
    reference backend (torch_native) over the same FP8 pool."""
    paths, results = cp2
    single = ParallelGroups.single()
    ref = generate_mla(paths["mla"][1], single, FP8, "torch_native")
    cp1 = generate_mla(paths["mla"][1], single, FP8, "dsa")
    for tag, got in [("cp1", cp1)] + [(f"cp2 rank {r}", res["dsa"]) for r, res in enumerate(results)]:
        assert got["dtype"] == "torch.float8_e4m3fn" and got["tokens"] == ref["tokens"], tag
        diff = max(float((a - b).abs().max()) for a, b in zip(got["logits"], ref["logits"]))
        assert diff <= TOL, f"{tag} dsa vs torch_native, fp8 cache: {diff}"
