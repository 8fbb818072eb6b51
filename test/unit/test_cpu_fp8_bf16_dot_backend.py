"""The `cpu` attention backend of a bf16 model over an FP8 KV pool where attention computes in bf16
without AMX (AMD's AVX512-BF16: `prefill_attention_dtype` bf16, `decode_bf16_dot`; forced here so the
test runs on every CPU, the AMX kernel reported absent): decode calls `decode_attention` with
`bf16_dot=True` on the 1-byte pool, and a chunk over a cached FP8 prefix calls the vector prefill
kernel with `bf16_dot=True` (before, that chunk fell back to the torch path). Its logits stay within
bf16 of the torch path's (gather + widen + SDPA) on the same pool."""

from __future__ import annotations

import copy

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.kernels.cpu import loader
from sglang.srt.layers.attention import cpu_backend
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.models.registry import ModelRegistry
from sglang.test.forward_helpers import ForwardHarness
from sglang.test.tiny_models import TINY_LLAMA_DIR, randomize_parameters


class _Spy:
    """The kernel module without its AMX prefill kernel, recording each decode_attention call's
    (pool dtype, bf16_dot) and each prefill_attention_vec call over a cached prefix."""

    def __init__(self, module):
        self.module, self.decode, self.prefix = module, [], []

    def __getattr__(self, name):
        return getattr(self.module, name)

    def prefill_attention_supported(self):
        return False

    def decode_attention(self, q, k_buf, *args):
        self.decode.append((k_buf.dtype, args[-1]))
        return self.module.decode_attention(q, k_buf, *args)

    def prefill_attention_vec(self, q, k, v, scale, k_cache=None, *args, **kwargs):
        if k_cache is not None:
            self.prefix.append((k_cache.dtype, kwargs.get("bf16_dot", False)))
        return self.module.prefill_attention_vec(q, k, v, scale, k_cache, *args, **kwargs)


def _greedy(model, cfg, kv_dtype) -> torch.Tensor:
    """Request A: a 9-token chunk, then 7 more over its cached prefix beside request B's 6 fresh
    tokens; then 6 batched decode steps on fixed tokens: every step's logits."""
    pool = MHATokenToKVPool(256, 1, torch.bfloat16, 2, 64, cfg.num_hidden_layers, kv_dtype=kv_dtype)
    for layer in range(cfg.num_hidden_layers):
        pool.set_kv_scales(layer, 0.05, 0.03)
    h = ForwardHarness(
        cfg, torch.bfloat16, max_total_tokens=256, max_context_len=128, attention_backend="cpu"
    )
    h.token_to_kv_pool = pool
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in (16, 6)]
    a, b = h.new_request(), h.new_request()
    h.forward(model, [(a, prompts[0][:9])])
    steps = [h.forward(model, [(a, prompts[0][9:]), (b, prompts[1])]).next_token_logits]
    for t in range(6):
        steps.append(h.forward(model, [(a, [5 + t]), (b, [9 + t])]).next_token_logits)
    return torch.stack(steps).float()


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_bf16_model_fp8_pool_takes_the_bf16_dot_kernels(monkeypatch, kv_dtype):
    module = loader.load()
    if module is None or not module.prefill_attention_vec_supported():
        pytest.skip("no vector CPU kernel build here")
    cfg = copy.deepcopy(ModelConfig(TINY_LLAMA_DIR).hf_config)
    cfg.head_dim = 64
    model = ModelRegistry.resolve(cfg.architectures)(cfg, None, torch.bfloat16).eval()
    with torch.no_grad():
        randomize_parameters(model, seed=3, std=0.2)
    spy = _Spy(module)
    monkeypatch.setattr(cpu_backend, "prefill_attention_dtype", lambda device, dtype: torch.bfloat16)
    monkeypatch.setattr(cpu_backend, "decode_bf16_dot", lambda device: True)
    monkeypatch.setattr(cpu_backend, "kernels_for_device", lambda device: spy)
    fused = _greedy(model, cfg, kv_dtype)
    assert spy.decode and set(spy.decode) == {(kv_dtype, True)}
    assert spy.prefix and set(spy.prefix) == {(kv_dtype, True)}
    monkeypatch.setattr(cpu_backend, "kernels_for_device", lambda device: None)
    torch_path = _greedy(model, cfg, kv_dtype)
    # The chunk over the FP8 prefix (step 0): bf16 activations, P rounded to bf16 in the kernel, a
    # few bf16 ulps of logits this size (seen: 1.3 %). Each later step writes its K / V rounded to
    # FP8, where a bf16-sized difference can cross an e4m3 / e5m2 rounding step and later steps
    # carry it (seen: 5 %; the same model on a bf16 pool: 1.8 %). Unapplied scales (0.05 / 0.03)
    # or misread codes move the logits by their whole size.
    scale = float(torch_path.abs().max())
    assert scale > 0.5
    torch.testing.assert_close(fused[0], torch_path[0], atol=0.03 * scale, rtol=0)
    torch.testing.assert_close(fused, torch_path, atol=0.1 * scale, rtol=0)
