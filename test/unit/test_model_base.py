"""The CausalLM / StageModel base: checkpoint layouts derived from the models
(`models/checkpoint_specs.py`) and the dummy weights drawn from them, for every tiny test config of
every registered model class; the defaults the model runner calls (stage layers, KV pool and its
bytes per token, context-parallel support); the registry's CausalLM rule."""

from __future__ import annotations

import glob
import os
from typing import Any, Callable

import pytest
import torch
from safetensors import safe_open
from transformers import (
    DeepseekV3Config,
    DeepseekV32Config,
    LlamaConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.parallel_state import GroupCoordinator, ParallelGroups, ParallelLayout
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool, MLATokenToKVPool
from sglang.srt.model_loader.dummy_loader import init_dummy_weights, iter_dummy_weights
from sglang.srt.models.causal_lm import CausalLM
from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM, DeepseekV32ForCausalLM
from sglang.srt.models.llama import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM
from sglang.srt.models.registry import ModelRegistry
from sglang.test.tiny_models import ASSETS_DIR, TINY_LLAMA_DIR, TINY_QWEN3_DIR
from sglang.test.tiny_moe_models import (
    DEEPSEEK_SIZES,
    deepseek_v3_config,
    deepseek_v32_config,
    qwen3_moe_config,
    save_random_model,
)

_COMMON = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=64,
)
_DSV32_DIR = os.path.join(ASSETS_DIR, "tiny-deepseek-v32")


def _asset(path: str) -> Callable[[], Any]:
    return lambda: ModelConfig(path).hf_config


# id -> (model class, config factory): the tiny configs of the tests, covering every layout switch
CASES: dict[str, tuple[type[CausalLM], Callable[[], Any]]] = {
    "llama_asset": (LlamaForCausalLM, _asset(TINY_LLAMA_DIR)),
    "smollm_tied": (LlamaForCausalLM, lambda: LlamaConfig(tie_word_embeddings=True, **_COMMON)),
    "llama_all_bias": (LlamaForCausalLM, lambda: LlamaConfig(attention_bias=True, mlp_bias=True, **_COMMON)),
    "qwen2_qkv_bias": (Qwen2ForCausalLM, lambda: Qwen2Config(**_COMMON)),
    "qwen3_asset_tied": (Qwen3ForCausalLM, _asset(TINY_QWEN3_DIR)),
    "qwen3_untied": (
        Qwen3ForCausalLM,
        lambda: Qwen3Config(head_dim=16, tie_word_embeddings=False, **_COMMON),
    ),
    "qwen3_moe_mlp_only": (Qwen3MoeForCausalLM, qwen3_moe_config),
    "qwen3_moe_sparse_step": (
        Qwen3MoeForCausalLM,
        lambda: Qwen3MoeConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=2,
            attention_bias=True,
        ),
    ),
    "dsv3_no_q_lora": (DeepseekV3ForCausalLM, deepseek_v3_config),
    "dsv3_q_lora": (DeepseekV3ForCausalLM, lambda: DeepseekV3Config(q_lora_rank=32, **DEEPSEEK_SIZES)),
    "dsv3_bias_no_shared": (
        DeepseekV3ForCausalLM,
        lambda: DeepseekV3Config(
            **{
                **DEEPSEEK_SIZES,
                "q_lora_rank": 16,
                "attention_bias": True,
                "n_shared_experts": 0,
                "first_k_dense_replace": 2,
                "num_hidden_layers": 4,
            }
        ),
    ),
    "dsv32_asset": (DeepseekV32ForCausalLM, _asset(_DSV32_DIR)),
    "dsv32_indexer": (DeepseekV32ForCausalLM, deepseek_v32_config),
    "dsv32_bias": (
        DeepseekV32ForCausalLM,
        lambda: DeepseekV32Config(
            q_lora_rank=16,
            index_n_heads=2,
            index_head_dim=8,
            index_topk=4,
            attention_bias=True,
            **{k: v for k, v in DEEPSEEK_SIZES.items() if k != "first_k_dense_replace"},
        ),
    ),
}
# one config of each model class: dummy weights checked against a real HF checkpoint's layout
HF_LAYOUT_CASES = [
    "llama_asset",
    "qwen2_qkv_bias",
    "qwen3_asset_tied",
    "qwen3_moe_mlp_only",
    "dsv3_no_q_lora",
    "dsv32_indexer",
]


def _fake(name: str, size: int, rank: int) -> GroupCoordinator:  # construction / loading only, no collectives
    return GroupCoordinator(name, list(range(size)), rank)


def _stage_groups(pp_rank: int) -> ParallelGroups:
    """Pipeline stage `pp_rank` of 2 on tp rank 1 of 2 (attention, dense and MoE tp all split)."""
    one = _fake("x", 1, 0)
    tp = dict(tp=_fake("tp", 2, 1), attn_tp=_fake("attn_tp", 2, 1), moe_tp=_fake("moe_tp", 2, 1))
    pp = _fake("pp", 2, pp_rank)
    return ParallelGroups(ParallelLayout(pp=2, tp=2), 2 + pp_rank, pp=pp, attn_cp=one, moe_ep=one, **tp)


@pytest.mark.parametrize("case", list(CASES))
def test_specs_load_into_every_parameter(case):
    """At tp 1 the specs go through `load_weights` and fill every parameter (nothing left over)."""
    model_cls, make_config = CASES[case]
    cfg = make_config()
    specs = model_cls.dummy_weight_specs(cfg)
    assert len({name for name, _ in specs}) == len(specs)
    model = model_cls(cfg, None, torch.float32)
    loaded = model.load_weights(iter_dummy_weights(specs, seed=0))
    assert loaded == {name for name, _ in model.named_parameters()}


def _checkpoint_layout(directory: str) -> list[tuple[str, tuple[int, ...]]]:
    layout = []
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            layout += [(name, tuple(f.get_slice(name).get_shape())) for name in f.keys()]
    return layout


@pytest.mark.parametrize("case", HF_LAYOUT_CASES)
def test_dummy_weights_follow_hf_checkpoint_layout(case, tmp_path):
    """The specs are the tensors of a transformers checkpoint of the same config, and dummy weights
    (whole model, and each stage of a pp 2 x tp 2 split) are what loading the dummy tensors of that
    checkpoint's names and shapes gives: derived from the HF layout, not from our specs."""
    model_cls, make_config = CASES[case]
    cfg = make_config()
    save_random_model(cfg, str(tmp_path))
    hf_layout = _checkpoint_layout(str(tmp_path))
    assert sorted(model_cls.dummy_weight_specs(cfg)) == sorted(hf_layout)

    for groups in (None, _stage_groups(0), _stage_groups(1)):
        expected = model_cls(cfg, groups, torch.float32)
        expected.load_weights(iter_dummy_weights(hf_layout, seed=5))  # other stages' layers are skipped
        model = model_cls(cfg, groups, torch.float32)
        init_dummy_weights(model, seed=5)
        got, want = model.state_dict(), expected.state_dict()
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), name


@pytest.mark.parametrize("path", [TINY_LLAMA_DIR, TINY_QWEN3_DIR, _DSV32_DIR])
@pytest.mark.parametrize("pp_rank", [0, 1])
def test_stage_range_and_kv_pool_defaults(path, pp_rank):
    """What ModelRunner calls: the stage's layer range, a pool of exactly those layers, and the
    pool's bytes per token slot. MHA models: the numbers ModelConfig gives (KV heads per attention
    tp rank, head_dim); MLA models: their latent (+ index key) pool."""
    mc = ModelConfig(path)
    model = ModelRegistry.resolve(mc.architectures)(mc.hf_config, _stage_groups(pp_rank), torch.float32)
    n = mc.num_hidden_layers
    assert (model.start_layer, model.end_layer) == ((0, n // 2) if pp_rank == 0 else (n // 2, n))
    pool = model.create_kv_pool(16, 1, torch.float32)
    assert (pool.start_layer, pool.end_layer) == (model.start_layer, model.end_layer)
    stage_layers = model.end_layer - model.start_layer
    if isinstance(model, DeepseekV3ForCausalLM):
        assert isinstance(pool, DSATokenToKVPool if model.use_indexer else MLATokenToKVPool)
        cfg = mc.hf_config
        want = DSATokenToKVPool.cell_size_bytes(
            cfg.kv_lora_rank, cfg.qk_rope_head_dim, stage_layers, torch.bfloat16, int(cfg.index_head_dim)
        )
    else:
        assert type(pool) is MHATokenToKVPool
        assert (pool.head_num, pool.head_dim) == (mc.get_num_kv_heads(2), mc.head_dim)
        want = MHATokenToKVPool.cell_size_bytes(
            mc.get_num_kv_heads(2), mc.head_dim, stage_layers, torch.bfloat16
        )
    assert model.kv_cell_size_bytes(torch.bfloat16) == want


def test_context_parallel_flag_and_registry_rule():
    assert CausalLM.supports_context_parallel is False
    for arch in ModelRegistry.supported_architectures():
        model_cls = ModelRegistry.resolve(arch)
        assert issubclass(model_cls, CausalLM) and model_cls.supports_context_parallel
    ModelRegistry.register("NotACausalLM", torch.nn.Linear)
    try:
        with pytest.raises(TypeError, match="must derive from CausalLM"):
            ModelRegistry.resolve("NotACausalLM")
    finally:
        ModelRegistry._models.pop("NotACausalLM")
