"""Shared layers against plain formulas / HF reference code.

If a model parity test fails, check these first: they isolate norm, rope, attention math, the
attention backends' paged gathers (the torch_native reference and the fast cpu backend) and the
tp weight loaders.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from sglang.srt.distributed.parallel_state import GroupCoordinator
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.attention.radix_attention import RadixAttention
from sglang.srt.layers.attention.cpu_backend import CPUAttnBackend
from sglang.srt.layers.attention.ops import attention_with_lse, causal_mask, merge_state
from sglang.srt.layers.attention.registry import (
    attention_backend_choices,
    check_attention_backend,
    create_attention_backend,
    default_attention_backend,
    get_attention_backend_class,
)
from sglang.srt.layers.attention.torch_native import TorchNativeAttnBackend
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from sglang.srt.layers.rotary import RotaryEmbedding, get_rope
from sglang.srt.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.models.registry import ModelRegistry
from sglang.srt.models.utils import PPMissingLayer, make_layers, pp_layer_range
from sglang.test.forward_helpers import ForwardHarness


def fake_tp(rank: int, size: int) -> GroupCoordinator:
    """A group coordinator for weight-loader maths only (no collectives are called)."""
    return GroupCoordinator("tp", list(range(size)), rank)


# ---------------------------------------------------------------------------- norm / activation
def test_rmsnorm_matches_formula_and_fuses_residual():
    torch.manual_seed(0)
    norm = RMSNorm(32, eps=1e-5)
    norm.weight.data.normal_(1.0, 0.3)
    x, r = torch.randn(7, 32) * 3, torch.randn(7, 32)

    def ref(t):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight

    torch.testing.assert_close(norm(x), ref(x), atol=1e-5, rtol=1e-5)
    out, new_res = norm(x, r)
    torch.testing.assert_close(new_res, x + r)
    torch.testing.assert_close(out, ref(x + r), atol=1e-5, rtol=1e-5)


def test_rmsnorm_bfloat16_keeps_dtype_and_is_close():
    torch.manual_seed(0)
    norm = RMSNorm(64, params_dtype=torch.bfloat16)
    x = torch.randn(5, 64) * 4
    out = norm(x.bfloat16())
    assert out.dtype == torch.bfloat16
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("kernels", ["fused", "torch"])
def test_rmsnorm_float32_residual_stream(kernels, monkeypatch):
    """--enable-fp32-residual (the CPU default): a bf16 norm starts the stream in float32, keeps each
    sum unrounded and norms it into bf16; the same through the fused kernel and the torch path, and
    a no-op for float32 weights."""
    if kernels == "torch":
        monkeypatch.setattr("sglang.srt.layers.layernorm.fused_ops", lambda x: None)
    torch.manual_seed(1)
    norm = RMSNorm(64, eps=1e-5, params_dtype=torch.bfloat16)
    norm.weight.data.normal_(1.0, 0.2)
    x = torch.randn(6, 64).bfloat16()
    assert norm.residual_from(x) is x  # off: the stream stays in the model dtype
    norm.set_float32_residual()
    res0 = norm.residual_from(x)
    assert res0.dtype == torch.float32 and torch.equal(res0, x.float())
    h = (torch.randn(6, 64) * 3).bfloat16()
    out, res = norm(h, res0)
    assert res.dtype == torch.float32 and torch.equal(res, h.float() + res0)
    ref = res / torch.sqrt(res.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.float()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=1e-2)
    norm32 = RMSNorm(64)
    norm32.set_float32_residual()
    assert not norm32.float32_residual and norm32.residual_from(x) is x


def test_silu_and_mul():
    x = torch.randn(3, 10)
    torch.testing.assert_close(SiluAndMul()(x), torch.nn.functional.silu(x[:, :5]) * x[:, 5:])


# ---------------------------------------------------------------------------- rotary
@pytest.mark.parametrize(
    "rope",
    [
        None,
        {"rope_type": "linear", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
    ids=["default", "linear", "llama3"],
)
def test_rotary_matches_hf_apply_rotary_pos_emb(rope):
    kwargs = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    if rope:
        kwargs["rope_scaling"] = rope
    cfg = LlamaConfig(rope_theta=5000.0, **kwargs)
    head_dim = 32
    ours = get_rope(cfg, head_dim, torch.float32)
    hf_rope = LlamaRotaryEmbedding(cfg)
    torch.testing.assert_close(ours.inv_freq, hf_rope.inv_freq.float())

    torch.manual_seed(0)
    positions = torch.tensor([0, 7, 3, 300, 511, 42])
    q, k = torch.randn(6, 4, head_dim), torch.randn(6, 2, head_dim)
    cos, sin = hf_rope(q, positions[None])  # [1, T, D]
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    q_out, k_out = ours(positions, q.reshape(6, -1), k.reshape(6, -1))
    torch.testing.assert_close(q_out.view(6, 4, head_dim), q_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out.view(6, 2, head_dim), k_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_rotary_rejects_unknown_scaling_and_grows_cache():
    with pytest.raises(ValueError, match="rope_type"):
        RotaryEmbedding(16, 32, rope_scaling={"rope_type": "yarn-ish", "factor": 2.0})
    rope = RotaryEmbedding(16, 32)
    before = rope.cos_cache.clone()
    rope.extend_cache(100)
    assert rope.cos_cache.shape == (100, 16)
    torch.testing.assert_close(rope.cos_cache[:32], before)


# ---------------------------------------------------------------------------- attention maths
def _softmax_attention(q, k, v, scale, mask):
    k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v, torch.log(torch.exp(s).sum(-1))


def test_attention_with_lse_matches_softmax_and_merges():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 11, 8), torch.randn(2, 2, 11, 8)
    scale = 8**-0.5
    mask = causal_mask(5, 11, q_offset=6)
    out, lse = attention_with_lse(q, k, v, scale, attn_mask=mask)
    ref_out, ref_lse = _softmax_attention(q, k, v, scale, mask)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)

    # split the keys in two disjoint shards (a context-parallel split) and merge
    shards = (slice(0, 4), slice(4, 11))
    parts = [attention_with_lse(q, k[:, :, s], v[:, :, s], scale, attn_mask=mask[:, s]) for s in shards]
    merged, merged_lse = merge_state([p[0] for p in parts], [p[1] for p in parts])
    torch.testing.assert_close(merged, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(merged_lse, ref_lse, atol=1e-5, rtol=1e-5)


def test_attention_with_lse_fully_masked_rows_drop_out_of_merge():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 3, 4), torch.randn(1, 6, 4), torch.randn(1, 6, 4)
    none_visible = torch.zeros(3, 6, dtype=torch.bool)
    out, lse = attention_with_lse(q, k, v, 0.5, attn_mask=none_visible)
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))
    full_out, full_lse = attention_with_lse(q, k, v, 0.5)
    merged, merged_lse = merge_state([out, full_out], [lse, full_lse])
    torch.testing.assert_close(merged, full_out)
    torch.testing.assert_close(merged_lse, full_lse)
    causal_out, _ = attention_with_lse(q, k[:, :3], v[:, :3], 0.5, is_causal=True)
    torch.testing.assert_close(causal_out[:, 0], v[:, 0])  # first query sees only the first key


@pytest.mark.parametrize("backend", ["torch_native", "cpu"])
def test_torch_native_backend_mixed_batch_matches_reference(backend):
    """Decode rows, an extend over a cached prefix and a fresh prefill in one MIXED batch."""
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1)
    h = ForwardHarness(cfg, max_total_tokens=256, attention_backend=backend)
    layer = RadixAttention(4, 8, 8**-0.5, 2, layer_id=0)
    reqs = [h.new_request() for _ in range(4)]
    # Requests 0..2 already hold 6, 9 and 4 tokens of random KV.
    keys: dict[int, torch.Tensor] = {}
    values: dict[int, torch.Tensor] = {}
    for r, n in zip(reqs[:3], (6, 9, 4)):
        fb = h.build_batch([(r, [1] * n)])
        keys[r.row], values[r.row] = torch.randn(n, 2, 8), torch.randn(n, 2, 8)
        h.token_to_kv_pool.set_kv_buffer(0, fb.out_cache_loc, keys[r.row], values[r.row])
    new = [(reqs[0], 1), (reqs[1], 3), (reqs[2], 1), (reqs[3], 5)]
    fb = h.build_batch([(r, [1] * n) for r, n in new])
    assert fb.forward_mode.name == "MIXED"
    T = fb.num_tokens
    q, k, v = torch.randn(T, 32), torch.randn(T, 16), torch.randn(T, 16)
    h.attn_backend.init_forward_metadata(fb)
    out = h.attn_backend.forward(q, k, v, layer, fb)
    assert out.shape == (T, 32)
    start = 0
    for r, n in new:
        old_k = keys.get(r.row, torch.empty(0, 2, 8))
        old_v = values.get(r.row, torch.empty(0, 2, 8))
        kk = torch.cat([old_k, k[start : start + n].view(n, 2, 8)]).transpose(0, 1)
        vv = torch.cat([old_v, v[start : start + n].view(n, 2, 8)]).transpose(0, 1)
        qq = q[start : start + n].view(n, 4, 8).transpose(0, 1)
        ref, _ = _softmax_attention(qq, kk, vv, 8**-0.5, causal_mask(n, kk.shape[1], q_offset=old_k.shape[0]))
        torch.testing.assert_close(
            out[start : start + n].view(n, 4, 8), ref.transpose(0, 1), atol=1e-5, rtol=1e-5
        )
        start += n
    # the new keys were written to the pool
    torch.testing.assert_close(h.token_to_kv_pool.get_key_buffer(0)[fb.out_cache_loc], k.view(T, 2, 8))


# ---------------------------------------------------------------------------- registries
def test_attention_registry():
    assert "torch_native" in attention_backend_choices()
    assert get_attention_backend_class("torch_native") is TorchNativeAttnBackend
    assert isinstance(create_attention_backend("torch_native", None), TorchNativeAttnBackend)
    with pytest.raises(ValueError, match="torch_native"):
        create_attention_backend("flashinfer-on-a-toaster")
    # the fast CPU backend, under its upstream name too; the former MLA reference is the reference
    assert get_attention_backend_class("cpu") is CPUAttnBackend
    assert get_attention_backend_class("intel_amx") is CPUAttnBackend
    assert get_attention_backend_class("torch_native_mla") is TorchNativeAttnBackend
    assert {"cpu", "intel_amx", "torch_native", "torch_native_mla"} <= set(attention_backend_choices())
    assert default_attention_backend("cpu") == "cpu" and default_attention_backend("cuda") == "torch_native"
    for cls in (TorchNativeAttnBackend, CPUAttnBackend):
        assert cls.supports_mha and cls.supports_mla and cls.supports_context_parallel


def test_attention_backend_model_pairing():
    from sglang.srt.layers.attention.base import AttentionBackend

    class MHAOnly(AttentionBackend):
        name = "mha_only_test"

        def init_forward_metadata(self, forward_batch):
            pass

        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
            raise AssertionError

        forward_decode = forward_extend

    from sglang.srt.layers.attention import registry

    registry.register_attention_backend("mha_only_test")(MHAOnly)
    try:
        check_attention_backend("mha_only_test", "mha", "LlamaForCausalLM")
        check_attention_backend("torch_native", "mla", "DeepseekV3ForCausalLM")
        with pytest.raises(
            ValueError, match="--attention-backend mha_only_test .*MLA.*DeepseekV3ForCausalLM"
        ):
            check_attention_backend("mha_only_test", "mla", "DeepseekV3ForCausalLM")
        with pytest.raises(NotImplementedError, match="mha_only_test"):
            MHAOnly().forward_mla(None, None, None, None)
    finally:
        registry._REGISTERED.pop("mha_only_test")
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM, DeepseekV32ForCausalLM
    from sglang.srt.models.llama import LlamaForCausalLM

    assert LlamaForCausalLM.attention_kind == "mha"
    assert DeepseekV3ForCausalLM.attention_kind == DeepseekV32ForCausalLM.attention_kind == "mla"


def test_model_registry():
    from sglang.srt.models.llama import LlamaForCausalLM, Qwen3ForCausalLM

    assert ModelRegistry.resolve(["Unknown", "LlamaForCausalLM"]) is LlamaForCausalLM
    assert ModelRegistry.resolve("Qwen3ForCausalLM") is Qwen3ForCausalLM
    with pytest.raises(ValueError, match="LlamaForCausalLM") as err:
        ModelRegistry.resolve(["GPTNeoXForCausalLM"])
    assert "GPTNeoXForCausalLM" in str(err.value)


def test_make_layers_and_pp_ranges():
    assert [pp_layer_range(30, r, 4) for r in range(4)] == [
        (0, 7),
        (7, 14),
        (14, 22),
        (22, 30),
    ]  # remainder last
    layers = make_layers(5, lambda i: torch.nn.Linear(2, 2), 1, 3)
    assert [isinstance(m, PPMissingLayer) for m in layers] == [True, False, False, True, True]
    with pytest.raises(ValueError):
        make_layers(5, lambda i: torch.nn.Linear(2, 2), 3, 7)


# ---------------------------------------------------------------------------- tp weight loaders
def test_qkv_loader_places_shards_and_replicates_kv():
    torch.manual_seed(0)
    hidden, hd = 8, 2
    wq, wk, wv = torch.randn(4 * hd, hidden), torch.randn(2 * hd, hidden), torch.randn(2 * hd, hidden)
    full = QKVParallelLinear(hidden, hd, 4, 2, bias=False)
    for sid, w in (("q", wq), ("k", wk), ("v", wv)):
        full.weight.weight_loader(full.weight, w, sid)
    torch.testing.assert_close(full.weight.data, torch.cat([wq, wk, wv]))
    x = torch.randn(3, hidden)
    torch.testing.assert_close(full(x), torch.cat([x @ wq.T, x @ wk.T, x @ wv.T], -1))

    rank1 = QKVParallelLinear(hidden, hd, 4, 2, bias=False, tp=fake_tp(1, 2))
    rank1.weight.weight_loader(rank1.weight, torch.cat([wq, wk, wv]))  # fused checkpoint tensor
    torch.testing.assert_close(rank1.weight.data, torch.cat([wq[4:], wk[2:], wv[2:]]))

    # 4 ranks, 2 KV heads: ranks 2 and 3 both hold KV head 1
    for rank in (2, 3):
        layer = QKVParallelLinear(hidden, hd, 4, 2, bias=False, tp=fake_tp(rank, 4))
        assert layer.num_kv_head_replicas == 2 and layer.num_kv_heads == 1
        for sid, w in (("q", wq), ("k", wk), ("v", wv)):
            layer.weight.weight_loader(layer.weight, w, sid)
        torch.testing.assert_close(
            layer.weight.data, torch.cat([wq[rank * 2 : rank * 2 + 2], wk[2:], wv[2:]])
        )
    with pytest.raises(ValueError, match="shard_id"):
        full.weight.weight_loader(full.weight, wq, "x")


def test_merged_column_and_row_parallel_reconstruct_full_linear():
    torch.manual_seed(0)
    gate, up, down = torch.randn(6, 4), torch.randn(6, 4), torch.randn(4, 6)
    x = torch.randn(5, 4)
    parts, partial_sums = [], []
    for rank in range(2):
        gu = MergedColumnParallelLinear(4, [6, 6], bias=False, tp=fake_tp(rank, 2))
        gu.weight.weight_loader(gu.weight, gate, 0)
        gu.weight.weight_loader(gu.weight, up, 1)
        mine = slice(rank * 3, rank * 3 + 3)
        torch.testing.assert_close(gu.weight.data, torch.cat([gate[mine], up[mine]]))
        act = SiluAndMul()(gu(x))
        parts.append(act)
        row = RowParallelLinear(6, 4, bias=False, tp=fake_tp(rank, 2))
        row.weight.weight_loader(row.weight, down)
        partial_sums.append(torch.nn.functional.linear(act, row.weight))  # the all-reduce adds these
    full_act = torch.nn.functional.silu(x @ gate.T) * (x @ up.T)
    torch.testing.assert_close(torch.cat(parts, -1), full_act)
    torch.testing.assert_close(partial_sums[0] + partial_sums[1], full_act @ down.T, atol=1e-5, rtol=1e-5)

    single = MergedColumnParallelLinear(4, [6, 6], bias=True)
    single.weight.weight_loader(single.weight, torch.cat([gate, up]))  # fused tensor, no shard id
    single.bias.weight_loader(single.bias, torch.arange(6.0), 1)
    torch.testing.assert_close(single.bias.data[6:], torch.arange(6.0))
    with pytest.raises(ValueError, match="shape mismatch"):
        single.weight.weight_loader(single.weight, torch.randn(5, 4), 0)


def test_column_replicated_and_divisibility_errors():
    w = torch.randn(8, 3)
    col = ColumnParallelLinear(3, 8, tp=fake_tp(3, 4))
    col.weight.weight_loader(col.weight, w)
    torch.testing.assert_close(col.weight.data, w[6:])
    rep = ReplicatedLinear(3, 8, bias=True)
    rep.weight.weight_loader(rep.weight, w)
    rep.bias.weight_loader(rep.bias, torch.ones(8))
    x = torch.randn(2, 3)
    torch.testing.assert_close(rep(x), x @ w.T + 1)
    with pytest.raises(ValueError, match="divisible"):
        ColumnParallelLinear(3, 10, tp=fake_tp(0, 4))
    with pytest.raises(ValueError, match="divisible"):
        QKVParallelLinear(8, 2, 6, 3, tp=fake_tp(0, 4))


def test_vocab_parallel_embedding_and_lm_head_shards():
    torch.manual_seed(0)
    w = torch.randn(10, 4)
    ids = torch.tensor([0, 9, 4, 3])
    emb_parts, logit_parts = [], []
    for rank in range(4):  # 10 rows over 4 ranks: 3 per rank, the last rank padded with 2 zero rows
        emb = VocabParallelEmbedding(10, 4, tp=fake_tp(rank, 4))
        emb.weight.weight_loader(emb.weight, w)
        assert emb.weight.shape == (3, 4)
        in_range = (ids >= emb.vocab_start_index) & (ids < emb.vocab_end_index)
        local = torch.nn.functional.embedding(
            torch.where(in_range, ids - emb.vocab_start_index, 0), emb.weight
        )
        emb_parts.append(local * in_range[:, None])
        logit_parts.append(torch.nn.functional.linear(torch.eye(4), emb.weight))
    torch.testing.assert_close(sum(emb_parts), w[ids])
    torch.testing.assert_close(torch.cat(logit_parts, -1)[:, :10], w.T)

    emb = VocabParallelEmbedding(10, 4)
    emb.weight.weight_loader(emb.weight, w)
    head = ParallelLMHead(10, 4)
    head.tie_to(emb)
    assert head.weight is emb.weight
    h = torch.randn(2, 4)
    torch.testing.assert_close(head.compute_logits(h), h @ w.T)
    torch.testing.assert_close(emb(ids), w[ids])
    assert math.isclose(float(head.compute_logits(torch.zeros(1, 4)).abs().sum()), 0.0)
