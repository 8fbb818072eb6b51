"""`--kv-cache-dtype fp8_e4m3 / fp8_e5m2`: a float32 model over a 1-byte KV pool against a reference
that rounds K and V the same way.

The reference is the same model and backend over a float32 pool whose writes pass K/V through
`(x / scale).to(fp8).to(float32) * scale` (written here, independently of the pool's
`quantize_kv`). Widening FP8 to float32 is exact, so the two runs see the same numbers: greedy
tokens must be equal and logits within LOGIT_TOL. A float32 pool without rounding must differ by
far more (the test would notice a pool that silently stored float32). Paths: fresh prefill,
chunked prefill over a cached prefix, batched decode; MHA (tiny Llama, `cpu` and `torch_native`
backends), the MLA latent pool (tiny DeepSeek-V3) and the DSA pool (tiny DeepSeek-V3.2: latent rows
and the indexer's keys, FP8 e4m3 with a float32 scale per 128 values as DeepSeek's reference keeps
them) on `torch_native` and on `dsa` (sgl_kernel_npu's fused ops reading the 1-byte rows in place).
"""

from __future__ import annotations

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool, MLATokenToKVPool
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM, DeepseekV32ForCausalLM
from sglang.srt.models.registry import ModelRegistry
from sglang.test.forward_helpers import ForwardHarness
from sglang.test.tiny_models import TINY_LLAMA_DIR, randomize_parameters
from sglang.test.tiny_moe_models import VOCAB, deepseek_v3_config, deepseek_v32_config, save_random_model

LOGIT_TOL = 1e-5  # float32 logits of the fp8 pool vs the rounding reference (same values, same math)
ROUNDING_MATTERS = 1e-3  # the unrounded float32 pool differs from the reference by more than this
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
DECODE_STEPS = 4


def _round(x: torch.Tensor, fp8: torch.dtype, scale: float) -> torch.Tensor:
    return (x.float() / scale).to(fp8).to(torch.float32) * scale


class RoundingMHAPool(MHATokenToKVPool):
    """float32 storage of fp8-rounded K/V (the reference); reads need no scale."""

    def __init__(self, *args, fp8: torch.dtype, scales=(1.0, 1.0), **kwargs):
        super().__init__(*args, **kwargs)
        self.fp8, self.scales = fp8, scales

    def set_kv_buffer(self, layer_id, loc, cache_k, cache_v):
        k_scale, v_scale = self.scales
        super().set_kv_buffer(
            layer_id, loc, _round(cache_k, self.fp8, k_scale), _round(cache_v, self.fp8, v_scale)
        )


class RoundingMLAPool(MLATokenToKVPool):
    def __init__(self, *args, fp8: torch.dtype, scale: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.fp8, self.scale = fp8, scale

    def set_kv_buffer(self, layer_id, loc, cache_k, cache_v=None):
        super().set_kv_buffer(layer_id, loc, _round(cache_k, self.fp8, self.scale))


def _round_index_keys(k: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3.2's index-key rounding: per block of 128 values, scale = max(amax, 1e-4) / 448,
    value = fp8_e4m3(k / scale) * scale (float32)."""
    n, dim = k.shape
    out = torch.empty((n, dim), dtype=torch.float32)
    for b0 in range(0, dim, 128):
        blk = k[:, b0 : b0 + 128].float()
        scale = blk.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4) / 448.0
        out[:, b0 : b0 + 128] = (blk / scale).to(torch.float8_e4m3fn).float() * scale
    return out


class RoundingDSAPool(DSATokenToKVPool):
    """A float32 DSA pool storing fp8-rounded latent rows and index keys (the reference)."""

    fp8 = torch.float8_e4m3fn

    def set_kv_buffer(self, layer_id, loc, cache_k, cache_v=None):
        super().set_kv_buffer(layer_id, loc, _round(cache_k, self.fp8, 1.0))

    def set_index_k_buffer(self, layer_id, loc, index_k):
        super().set_index_k_buffer(layer_id, loc, _round_index_keys(index_k))


def _drive(model, cfg, pool, backend: str) -> tuple[list[int], torch.Tensor]:
    """Request A: a 9-token chunk, then 7 more over its cached prefix; request B: 6 fresh tokens
    in the same step; then batched greedy decode. Returns (greedy tokens, logits of every step)."""
    h = ForwardHarness(cfg, max_total_tokens=256, max_context_len=128, attention_backend=backend)
    h.token_to_kv_pool = pool
    g = torch.Generator().manual_seed(7)
    prompt_a = torch.randint(3, cfg.vocab_size, (16,), generator=g).tolist()
    prompt_b = torch.randint(3, cfg.vocab_size, (6,), generator=g).tolist()
    a, b = h.new_request(), h.new_request()
    h.forward(model, [(a, prompt_a[:9])])
    logits = h.forward(model, [(a, prompt_a[9:]), (b, prompt_b)]).next_token_logits
    steps, tokens = [logits], []
    for _ in range(DECODE_STEPS):
        nxt = [int(t) for t in logits.argmax(dim=-1)]
        tokens.extend(nxt)
        logits = h.forward(model, [(a, [nxt[0]]), (b, [nxt[1]])]).next_token_logits
        steps.append(logits)
    return tokens, torch.stack(steps)


@pytest.fixture(scope="module")
def llama():
    """The tiny Llama asset's config (2 KV heads of 16) with seeded random weights."""
    cfg = ModelConfig(TINY_LLAMA_DIR).hf_config
    model = ModelRegistry.resolve(cfg.architectures)(cfg, None, torch.float32).eval()
    with torch.no_grad():
        randomize_parameters(model, seed=1, std=0.2)
    return model, cfg


def _mha_pool(cfg, kv_dtype=None):
    return MHATokenToKVPool(256, 1, torch.float32, 2, 16, cfg.num_hidden_layers, kv_dtype=kv_dtype)


@pytest.mark.parametrize("backend", ["cpu", "torch_native"])
@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_mha_fp8_pool_matches_rounding_reference(llama, backend, name):
    model, cfg = llama
    fp8 = FP8[name]
    pool = _mha_pool(cfg, fp8)
    assert pool.k_head_major[0].element_size() == 1 and pool.dtype == fp8
    ref = RoundingMHAPool(256, 1, torch.float32, 2, 16, cfg.num_hidden_layers, fp8=fp8)
    tokens, logits = _drive(model, cfg, pool, backend)
    ref_tokens, ref_logits = _drive(model, cfg, ref, backend)
    assert tokens == ref_tokens
    assert float((logits - ref_logits).abs().max()) <= LOGIT_TOL
    _, plain = _drive(model, cfg, _mha_pool(cfg), backend)
    assert float((plain - ref_logits).abs().max()) > ROUNDING_MATTERS


def test_mha_fp8_pool_applies_checkpoint_scales(llama):
    """Per-layer k_scale / v_scale: stored x / scale, read back * scale (parity with the reference
    rounding the same way); the scales change the result."""
    model, cfg = llama
    fp8 = torch.float8_e4m3fn
    scales = (0.05, 0.03)  # small scales: K/V use more of e4m3's range (and its coarser top)
    pool = _mha_pool(cfg, fp8)
    for layer in range(cfg.num_hidden_layers):
        pool.set_kv_scales(layer, *scales)
    ref = RoundingMHAPool(256, 1, torch.float32, 2, 16, cfg.num_hidden_layers, fp8=fp8, scales=scales)
    tokens, logits = _drive(model, cfg, pool, "cpu")
    ref_tokens, ref_logits = _drive(model, cfg, ref, "cpu")
    assert tokens == ref_tokens
    assert float((logits - ref_logits).abs().max()) <= LOGIT_TOL
    _, unscaled = _drive(model, cfg, _mha_pool(cfg, fp8), "cpu")
    assert float((unscaled - logits).abs().max()) > LOGIT_TOL


def _deepseek(tmp_path_factory, name):
    path = str(tmp_path_factory.mktemp(name))
    cfg = deepseek_v3_config() if name == "v3" else deepseek_v32_config(index_topk=8)
    save_random_model(cfg, path, seed=4)
    model_cls = DeepseekV3ForCausalLM if name == "v3" else DeepseekV32ForCausalLM
    model = model_cls(cfg, None, torch.float32).eval()
    model.load_weights(iter_safetensors_weights(path))
    return model, cfg


@pytest.mark.parametrize("name, backend", [("v3", "torch_native"), ("v32", "torch_native"), ("v32", "dsa")])
def test_mla_fp8_latent_pool_matches_rounding_reference(tmp_path_factory, name, backend):
    """Dense MLA (V3) and DSA sparse latent attention (V3.2, index_topk 8 < the 16-token prompt),
    the reference always on torch_native."""
    model, cfg = _deepseek(tmp_path_factory, name)
    assert cfg.vocab_size == VOCAB
    fp8 = torch.float8_e4m3fn
    pool = model.create_kv_pool(256, 1, torch.float32, "cpu", fp8)
    assert isinstance(pool, MLATokenToKVPool) and pool.kv_buffer[0].dtype == fp8
    assert model.kv_cell_size_bytes(torch.float32, fp8) < model.kv_cell_size_bytes(torch.float32)
    args = (256, 1, torch.float32, cfg.kv_lora_rank, cfg.qk_rope_head_dim)
    if name == "v3":
        assert model.kv_cell_size_bytes(torch.bfloat16, fp8) * 2 == model.kv_cell_size_bytes(torch.bfloat16)
        ref_pool = RoundingMLAPool(*args, cfg.num_hidden_layers, fp8=fp8)
    else:  # FP8 index keys: 32 codes + one float32 scale per token and layer
        assert pool.index_k_buffer[0].dtype == torch.uint8 and pool.index_k_buffer[0].shape[1] == 32 + 4
        ref_pool = RoundingDSAPool(*args, int(cfg.index_head_dim), cfg.num_hidden_layers)
    tokens, logits = _drive(model, cfg, pool, backend)
    ref_tokens, ref_logits = _drive(model, cfg, ref_pool, "torch_native")
    assert tokens == ref_tokens
    assert float((logits - ref_logits).abs().max()) <= LOGIT_TOL
    _, plain = _drive(model, cfg, model.create_kv_pool(256, 1, torch.float32), "torch_native")
    assert float((plain - ref_logits).abs().max()) > ROUNDING_MATTERS


def test_dsa_int8_index_scoring_over_fp8_index_keys(tmp_path_factory, monkeypatch):
    """`SGLANG_DSA_INDEX_SCORE_DTYPE=int8` with FP8 index keys: the pool's int8 copy is quantized
    from the widened FP8 keys, so the `dsa` backend scores exactly as over a float32 pool holding
    the rounded keys (and their int8 copy)."""
    monkeypatch.setenv("SGLANG_DSA_INDEX_SCORE_DTYPE", "int8")
    model, cfg = _deepseek(tmp_path_factory, "v32")
    pool = model.create_kv_pool(256, 1, torch.float32, "cpu", torch.float8_e4m3fn)
    assert pool.index_k_fp8 and pool.index_k_int8
    args = (256, 1, torch.float32, cfg.kv_lora_rank, cfg.qk_rope_head_dim, int(cfg.index_head_dim))
    ref_pool = RoundingDSAPool(*args, cfg.num_hidden_layers, index_k_int8=True)
    tokens, logits = _drive(model, cfg, pool, "dsa")
    ref_tokens, ref_logits = _drive(model, cfg, ref_pool, "dsa")
    assert tokens == ref_tokens
    assert float((logits - ref_logits).abs().max()) <= LOGIT_TOL


def test_engine_serves_v32_on_dsa_with_fp8_kv(tmp_path_factory):
    """`--attention-backend dsa --kv-cache-dtype fp8_e4m3` on tiny V3.2 through the scheduler: it
    starts, generates the greedy tokens of the reference backend over the same FP8 pool, and its
    pool holds 1 byte per latent and index-key value plus one 4-byte scale per token and layer:
    half a bf16 model's bf16 cache up to those scales."""
    from sglang.test.scheduler_harness import SchedulerHarness

    path = str(tmp_path_factory.mktemp("v32_engine"))
    cfg = deepseek_v32_config(index_topk=8)
    save_random_model(cfg, path, seed=4)
    runs = {}
    for backend in ("dsa", "torch_native"):
        h = SchedulerHarness(
            model_path=path, max_total_tokens=256, attention_backend=backend, kv_cache_dtype="fp8_e4m3"
        )
        rid = h.submit(list(range(5, 25)), 6)
        h.run()
        runs[backend] = (h.outputs[rid], h.scheduler.internal_state())
    tokens, state = runs["dsa"]
    assert tokens == runs["torch_native"][0] and len(tokens) == 6
    assert state["kv_cache_storage_dtype"] == "float8_e4m3fn"
    rows, layers = 256 + 1, cfg.num_hidden_layers  # the pool's rows: size + page_size
    values = cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim
    assert state["kv_pool_bytes"] == rows * layers * (values + 4)
    bf16 = rows * DSATokenToKVPool.cell_size_bytes(
        cfg.kv_lora_rank, cfg.qk_rope_head_dim, layers, torch.bfloat16, cfg.index_head_dim
    )
    assert 2 * (state["kv_pool_bytes"] - rows * layers * 4) == bf16


def test_engine_serves_fp8_kv_and_reports_it(monkeypatch):
    """The flag through the scheduler: the runner's pool stores 1 byte (a quarter of the float32
    model's `auto` pool at the same --max-total-tokens, half of `bf16`'s), /get_server_info's
    internal state says so, and a backend that cannot read FP8 is refused at start-up naming both
    flags (every built-in backend reads it: `dsa` stands in, its flag turned off)."""
    from sglang.srt.layers.attention.dsa_backend import DSAAttnBackend
    from sglang.test.scheduler_harness import SchedulerHarness

    states = {}
    for name in ("fp8_e4m3", "bf16", "auto"):
        h = SchedulerHarness(
            model_path=TINY_LLAMA_DIR, load_format="dummy", max_total_tokens=256, kv_cache_dtype=name
        )
        rid = h.submit(list(range(5, 17)), 6)
        h.run()
        assert len(h.outputs[rid]) == 6
        states[name] = h.scheduler.internal_state()
    assert states["fp8_e4m3"]["kv_cache_storage_dtype"] == "float8_e4m3fn"
    assert states["auto"]["kv_cache_storage_dtype"] == "float32"
    assert states["bf16"]["kv_cache_storage_dtype"] == "bfloat16"
    assert states["auto"]["kv_pool_bytes"] == 4 * states["fp8_e4m3"]["kv_pool_bytes"]
    assert states["bf16"]["kv_pool_bytes"] == 2 * states["fp8_e4m3"]["kv_pool_bytes"]
    monkeypatch.setattr(DSAAttnBackend, "supports_fp8_kv", False)
    with pytest.raises(
        ValueError, match="--kv-cache-dtype fp8_e5m2 is not supported with --attention-backend dsa"
    ):
        SchedulerHarness(
            model_path=TINY_LLAMA_DIR, load_format="dummy", kv_cache_dtype="fp8_e5m2", attention_backend="dsa"
        )
