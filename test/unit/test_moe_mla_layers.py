"""MoE / MLA / DSA building blocks against transformers and brute-force references (CPU, float32).

Routing (DeepSeek sigmoid grouped top-k with correction bias, Qwen3 softmax top-k), the reference
fused experts and their EP / MoE-TP sharding (partials of fake ranks sum to the full output), the
MLA / DSA pools, YaRN frequencies and the MLA softmax scale, the Lightning Indexer's selection vs a
brute-force score, sparse attention selecting every visible token == dense absorbed attention, and
dummy-weight specs covering every parameter of the new models.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DeepseekV3Config, DeepseekV32Config, Qwen3MoeConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Experts,
    DeepseekV3TopkRouter,
    yarn_apply_mscale,
)
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

from sglang.srt.distributed.parallel_state import GroupCoordinator
from sglang.srt.layers.attention.dsa import indexer as indexer_mod
from sglang.srt.layers.attention.dsa.indexer import hadamard_matrix, index_topk_positions
from sglang.srt.layers.attention.mla import MLACore
from sglang.srt.layers.attention.paged_metadata import build_paged_metadata
from sglang.srt.layers.attention.torch_native import TorchNativeAttnBackend
from sglang.srt.layers.moe.experts import FusedMoE, match_expert_weight
from sglang.srt.layers.moe.router import MoEGate
from sglang.srt.layers.moe.topk import TopKConfig
from sglang.srt.layers.rotary_yarn import mla_softmax_scale, rope_frequencies
from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool, MLATokenToKVPool
from sglang.srt.model_executor.forward_batch import ForwardBatch, ForwardMode
from sglang.srt.model_loader.dummy_loader import iter_dummy_weights
from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM, DeepseekV32ForCausalLM
from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM
from sglang.test.forward_helpers import ForwardHarness

E, HID, INTER = 8, 32, 16
_DS = dict(
    vocab_size=64,
    hidden_size=HID,
    intermediate_size=48,
    moe_intermediate_size=INTER,
    num_hidden_layers=3,
    first_k_dense_replace=1,
    num_attention_heads=4,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=8,
    n_routed_experts=E,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    max_position_embeddings=256,
)


def _fake(name: str, size: int, rank: int) -> GroupCoordinator:
    return GroupCoordinator(name, list(range(size)), rank)


def _sorted_pairs(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = ids.argsort(dim=-1)
    return weights.gather(1, order), ids.gather(1, order)


def test_grouped_sigmoid_topk_matches_hf_router():
    cfg = DeepseekV3Config(q_lora_rank=None, **_DS)
    hf = DeepseekV3TopkRouter(cfg)
    g = torch.Generator().manual_seed(0)
    hf.weight.data.normal_(0, 0.5, generator=g)
    hf.e_score_correction_bias.normal_(0, 0.3, generator=g)
    topk = TopKConfig(
        top_k=2,
        scoring_func="sigmoid",
        renormalize=True,
        num_expert_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
    )
    ours = MoEGate(HID, E, topk, torch.float32, correction_bias=True, logits_in_fp32=True)
    ours.weight.data.copy_(hf.weight.data)
    ours.e_score_correction_bias.data.copy_(hf.e_score_correction_bias)
    x = torch.randn(64, HID, generator=g)
    _, hw, hi = hf(x)
    ow, oi = ours(x)
    hw, hi = _sorted_pairs(hw, hi)
    ow, oi = _sorted_pairs(ow, oi)
    assert torch.equal(hi, oi)
    torch.testing.assert_close(ow, hw, atol=1e-6, rtol=0)
    # the bias steers the choice: without it some tokens pick other experts
    ours.e_score_correction_bias.data.zero_()
    assert not torch.equal(_sorted_pairs(*ours(x))[1], oi)


def test_softmax_topk_matches_hf_qwen3_router():
    cfg = Qwen3MoeConfig(hidden_size=HID, num_experts=E, num_experts_per_tok=3, norm_topk_prob=True)
    hf = Qwen3MoeTopKRouter(cfg)
    g = torch.Generator().manual_seed(1)
    hf.weight.data.normal_(0, 0.5, generator=g)
    ours = MoEGate(HID, E, TopKConfig(top_k=3, renormalize=True), torch.float32)
    ours.weight.data.copy_(hf.weight.data)
    x = torch.randn(40, HID, generator=g)
    _, hw, hi = hf(x)
    ow, oi = ours(x)
    assert torch.equal(oi, hi)
    torch.testing.assert_close(ow, hw, atol=1e-6, rtol=0)
    torch.testing.assert_close(ow.sum(-1), torch.ones(40), atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def hf_experts():
    cfg = DeepseekV3Config(q_lora_rank=None, **_DS)
    experts = DeepseekV3Experts(cfg)
    g = torch.Generator().manual_seed(2)
    experts.gate_up_proj.data.normal_(0, 0.3, generator=g)
    experts.down_proj.data.normal_(0, 0.3, generator=g)
    return experts


def test_fused_experts_match_hf_and_shards_sum_to_full(hf_experts):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(30, HID, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:2] for _ in range(30)])
    weights = torch.rand(30, 2, generator=g)
    with torch.no_grad():
        ref = hf_experts(x, ids, weights)
    full = FusedMoE(E, HID, INTER, None, None, torch.float32)
    full.weight_loader(full.w13_weight, hf_experts.gate_up_proj.data, "w13")
    full.weight_loader(full.w2_weight, hf_experts.down_proj.data, "w2")
    torch.testing.assert_close(full(x, weights, ids), ref, atol=1e-5, rtol=0)

    # 2 EP ranks x 2 MoE-TP ranks, loaded expert by expert as from a checkpoint
    total = torch.zeros_like(ref)
    for ep_rank in range(2):
        for tp_rank in range(2):
            part = FusedMoE(
                E, HID, INTER, _fake("moe_ep", 2, ep_rank), _fake("moe_tp", 2, tp_rank), torch.float32
            )
            assert part.w13_weight.shape == (E // 2, INTER, HID) and part.expert_start == ep_rank * E // 2
            for e in range(E):
                gate, up = hf_experts.gate_up_proj.data[e].split(INTER)
                for proj, tensor in (
                    ("gate_proj", gate),
                    ("up_proj", up),
                    ("down_proj", hf_experts.down_proj.data[e]),
                ):
                    param_name, shard = match_expert_weight(f"model.layers.1.mlp.experts.{e}.{proj}.weight")
                    param = getattr(part, param_name.rsplit(".", 1)[1])
                    part.weight_loader(param, tensor, shard)
            out = part(x, weights, ids)
            assert out.abs().max() > 0
            total += out
    torch.testing.assert_close(total, ref, atol=1e-5, rtol=0)
    fused = match_expert_weight("model.layers.3.mlp.experts.gate_up_proj")
    assert fused == ("model.layers.3.mlp.experts.w13_weight", "w13")
    assert match_expert_weight("model.layers.3.mlp.shared_experts.gate_proj.weight") is None


def test_mla_and_dsa_pools():
    pool = DSATokenToKVPool(16, 1, torch.float32, 8, 4, 6, layer_num=2, start_layer=3)
    loc = torch.tensor([2, 5])
    latent, rope, idx_k = torch.randn(2, 8), torch.randn(2, 4), torch.randn(2, 6)
    pool.set_mla_kv_buffer(4, loc, latent, rope)
    pool.set_index_k_buffer(4, loc, idx_k)
    assert pool.get_key_buffer(4).shape == (17, 1, 12)
    assert torch.equal(pool.get_key_buffer(4)[loc, 0], torch.cat((latent, rope), -1))
    assert torch.equal(pool.get_value_buffer(4)[loc, 0], latent)
    assert torch.equal(pool.get_index_k_buffer(4)[loc], idx_k)
    assert pool.get_key_buffer(3).abs().sum() == 0  # other layer untouched
    with pytest.raises(IndexError):
        pool.get_key_buffer(5)
    assert pool.mem_bytes() == 2 * 17 * (12 + 6) * 4
    assert DSATokenToKVPool.cell_size_bytes(512, 64, 61, torch.bfloat16, 128) == (576 + 128) * 61 * 2
    assert MLATokenToKVPool.cell_size_bytes(512, 64, 61, torch.bfloat16) == 576 * 61 * 2
    assert pool.get_index_k_int8(4) is None


def test_dsa_pool_int8_index_key_copy():
    """With index_k_int8 the pool also keeps each written index key as int8 + per-token scale: the
    quantization of the stored (pool-dtype) row, so it equals what a kernel quantizing the cache
    would see."""
    from sgl_kernel_npu.reference import quantize_int8

    pool = DSATokenToKVPool(16, 1, torch.bfloat16, 8, 4, 6, layer_num=2, start_layer=3, index_k_int8=True)
    loc, idx_k = torch.tensor([2, 5, 9]), torch.randn(3, 6) * torch.tensor([[1.0], [30.0], [0.01]])
    pool.set_index_k_buffer(4, loc, idx_k)
    k8, scale = pool.get_index_k_int8(4)
    want8, want_scale = quantize_int8(idx_k.bfloat16())
    assert k8.dtype == torch.int8 and torch.equal(k8[loc], want8) and torch.equal(scale[loc], want_scale)
    assert int(k8[loc].abs().amax()) == 127 and pool.get_index_k_int8(3)[0].abs().sum() == 0
    assert pool.mem_bytes() == 2 * 17 * (12 + 6) * 2 + 2 * 17 * (6 + 4)
    assert DSATokenToKVPool.cell_size_bytes(512, 64, 61, torch.bfloat16, 128, index_k_int8=True) == (
        (576 + 128) * 61 * 2 + (128 + 4) * 61
    )


def test_yarn_frequencies_and_mla_scale_match_hf():
    yarn = {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "rope_theta": 10000.0,
    }
    cfg = DeepseekV3Config(
        **{**_DS, "qk_rope_head_dim": 64, "max_position_embeddings": 163840}, rope_parameters=yarn
    )
    hf_inv, hf_factor = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    inv, factor = rope_frequencies(64, 10000.0, dict(yarn), 163840)
    torch.testing.assert_close(inv, hf_inv, atol=0, rtol=1e-6)
    assert factor == pytest.approx(hf_factor) and factor == pytest.approx(1.0)
    scale = mla_softmax_scale(192, cfg)
    assert scale == pytest.approx(yarn_apply_mscale(cfg.rope_parameters, 192**-0.5))
    assert scale == pytest.approx(192**-0.5 * (0.1 * math.log(40) + 1) ** 2)
    inv_plain, f_plain = rope_frequencies(64, 10000.0, None, 4096)
    assert f_plain == 1.0 and not torch.allclose(inv_plain, inv)


def test_hadamard_is_orthonormal():
    h = hadamard_matrix(32)
    torch.testing.assert_close(h @ h.T, torch.eye(32), atol=1e-6, rtol=0)
    with pytest.raises(ValueError):
        hadamard_matrix(24)


def _mixed_batch(pool_size: int = 128):
    """A MIXED batch: a decodes (seq 12), b extends 5 tokens over a 9-token prefix, c prefills 7,
    d decodes (seq 4: decodes of different lengths are padded)."""
    cfg = DeepseekV3Config(q_lora_rank=None, **_DS)
    h = ForwardHarness(cfg, max_total_tokens=pool_size, max_context_len=64)
    a, b, c, d = (h.new_request() for _ in range(4))
    h.build_batch([(a, list(range(11))), (b, list(range(9))), (d, [5, 6, 7])])  # fill the prefixes
    return h, h.build_batch([(a, [1]), (b, list(range(5))), (c, list(range(7))), (d, [8])])


def test_index_topk_positions_match_brute_force(monkeypatch):
    monkeypatch.setattr(indexer_mod, "SCORE_BUDGET", 64)  # force several query blocks
    h, fb = _mixed_batch()
    g = torch.Generator().manual_seed(4)
    n, heads, dim, topk = fb.num_tokens, 3, 8, 4
    q, w = torch.randn(n, heads, dim, generator=g), torch.randn(n, heads, generator=g)
    k_cache = torch.randn(129, dim, generator=g)
    got = index_topk_positions(q, w, k_cache, build_paged_metadata(fb), topk, dim**-0.5)
    assert got.shape == (n, topk)
    table = h.req_to_token_pool.req_to_token
    starts = [0, 1, 6, 13]
    for r, (start, ext) in enumerate(zip(starts, fb.extend_seq_lens_cpu)):
        row = int(fb.req_pool_indices[r])
        for j in range(ext):
            pos = fb.extend_prefix_lens_cpu[r] + j
            keys = k_cache[table[row, : pos + 1]]
            score = (torch.relu(q[start + j] @ keys.T * dim**-0.5) * w[start + j, :, None]).sum(0)
            expect = torch.sort(score, descending=True, stable=True).indices[: min(topk, pos + 1)].tolist()
            assert got[start + j].tolist() == expect + [-1] * (topk - len(expect)), (r, j)


def test_sparse_selecting_all_visible_equals_dense():
    h, fb = _mixed_batch()
    layer_id, lat, rope, heads = 0, 16, 4, 4
    pool = MLATokenToKVPool(128, 1, torch.float32, lat, rope, layer_num=1)
    pool.kv_buffer[0].normal_(generator=torch.Generator().manual_seed(5))
    fb.token_to_kv_pool = pool
    g = torch.Generator().manual_seed(6)
    q = torch.randn(fb.num_tokens, heads, lat + rope, generator=g)
    kv_new = torch.randn(fb.num_tokens, lat + rope, generator=g)
    core = MLACore(heads, lat, rope, 0.3, layer_id)
    backend = TorchNativeAttnBackend()
    dense = backend.forward_mla(q, kv_new, core, fb)  # stores kv_new, then dense attention
    width = max(fb.seq_lens_cpu)
    pos = torch.arange(width).expand(fb.num_tokens, width)
    all_visible = torch.where(pos <= fb.positions[:, None], pos, -1)
    sparse = backend.attend_latent(q, core, fb, topk_positions=all_visible)
    torch.testing.assert_close(sparse, dense, atol=1e-5, rtol=0)
    # a brute-force check of one extend token (request b, its 3rd new token at position 11)
    t, row = 3, int(fb.req_pool_indices[1])
    rows = pool.kv_buffer[0][h.req_to_token_pool.req_to_token[row, :12], 0]
    p = torch.softmax(q[t] @ rows.T * 0.3, -1)
    torch.testing.assert_close(dense[t], p @ rows[:, :lat], atol=1e-5, rtol=0)
    # selecting fewer keys changes the result
    first_two = torch.where(pos < 2, pos, -1)
    assert (backend.attend_latent(q, core, fb, topk_positions=first_two) - dense).abs().max() > 1e-3


@pytest.mark.parametrize(
    "model_cls,config",
    [
        (DeepseekV3ForCausalLM, lambda: DeepseekV3Config(q_lora_rank=None, **_DS)),
        (
            DeepseekV32ForCausalLM,
            lambda: DeepseekV32Config(
                q_lora_rank=16, index_n_heads=2, index_head_dim=8, index_topk=4, attention_bias=True, **_DS
            ),
        ),
        (
            Qwen3MoeForCausalLM,
            lambda: Qwen3MoeConfig(
                vocab_size=64,
                hidden_size=HID,
                intermediate_size=48,
                moe_intermediate_size=INTER,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=8,
                num_experts=E,
                num_experts_per_tok=2,
                decoder_sparse_step=2,
            ),
        ),
    ],
    ids=["v3", "v32", "qwen3_moe"],
)
def test_dummy_weights_cover_every_parameter_and_run(model_cls, config):
    """Dummy specs fill every parameter; an IDLE batch and a 12-token prefill (sparse for V3.2) run."""
    cfg = config()
    model = model_cls(cfg, None, torch.float32).eval()
    loaded = model.load_weights(iter_dummy_weights(model_cls.dummy_weight_specs(cfg), seed=0, std=0.2))
    assert loaded == {name for name, _ in model.named_parameters()}
    h = ForwardHarness(cfg, max_total_tokens=64, max_context_len=32)
    h.token_to_kv_pool = model.create_kv_pool(64, 1, torch.float32)
    empty = torch.empty(0, dtype=torch.int64)
    idle = ForwardBatch(
        forward_mode=ForwardMode.IDLE,
        batch_size=0,
        input_ids=empty,
        positions=empty,
        out_cache_loc=empty,
        req_pool_indices=empty,
        seq_lens=empty,
        extend_prefix_lens=empty,
        extend_seq_lens=empty,
        seq_lens_cpu=[],
        extend_prefix_lens_cpu=[],
        extend_seq_lens_cpu=[],
        req_to_token_pool=h.req_to_token_pool,
        token_to_kv_pool=h.token_to_kv_pool,
        attn_backend=h.attn_backend,
    )
    assert h.run(model, idle).next_token_logits.shape == (0, 64)
    logits = h.forward(model, [(h.new_request(), list(range(3, 15)))]).next_token_logits
    assert logits.shape == (1, 64) and torch.isfinite(logits).all() and logits.std() > 0
