"""The `cpu` attention backend over an FP8 KV pool (`--kv-cache-dtype fp8_*`, with layer scales):
decode and a chunk over a cached FP8 prefix run the fused kernels on the 1-byte pool, against the
backend's torch path (gather + widen + SDPA) on the same pool.

- float32 model: the kernels' float32 paths; the same greedy tokens.
- bf16 model where attention computes in bf16 without AMX (AMD's AVX512-BF16:
  `prefill_attention_dtype` bf16, `decode_bf16_dot`; forced here so the test runs on every CPU,
  the AMX kernel reported absent): both calls take the kernels' `bf16_dot` paths (before, the
  chunk over an FP8 prefix fell back to the torch path); logits within bf16 of the torch path's."""

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

SCALES = (0.05, 0.03)  # small: K / V use more of the FP8 range (and its coarser top)
KV_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


class _Spy:
    """The kernel module, recording the pool dtype and `bf16_dot` flag of every decode_attention
    call and of every prefill_attention_vec call over a cached prefix; `amx=False`: its AMX prefill
    kernel reported absent."""

    def __init__(self, module, amx: bool = True):
        self.module, self.amx, self.decode, self.prefix = module, amx, [], []

    def __getattr__(self, name):
        return getattr(self.module, name)

    def prefill_attention_supported(self):
        return self.amx and self.module.prefill_attention_supported()

    def decode_attention(self, q, k_buf, *args):
        self.decode.append((k_buf.dtype, args[-1]))
        return self.module.decode_attention(q, k_buf, *args)

    def prefill_attention_vec(self, q, k, v, scale, k_cache=None, *args, **kwargs):
        if k_cache is not None:
            self.prefix.append((k_cache.dtype, kwargs.get("bf16_dot", False)))
        return self.module.prefill_attention_vec(q, k, v, scale, k_cache, *args, **kwargs)

    @property
    def decode_dtypes(self) -> list[torch.dtype]:
        return [d for d, _ in self.decode]

    @property
    def prefix_dtypes(self) -> list[torch.dtype]:
        return [d for d, _ in self.prefix]


def _llama64(dtype: torch.dtype):
    """The tiny Llama with head dim 64 (the kernels' fixed-width vector paths) and random weights."""
    cfg = copy.deepcopy(ModelConfig(TINY_LLAMA_DIR).hf_config)
    cfg.head_dim = 64
    model = ModelRegistry.resolve(cfg.architectures)(cfg, None, dtype).eval()
    with torch.no_grad():
        randomize_parameters(model, seed=3, std=0.2)
    return model, cfg


@pytest.fixture(scope="module")
def llama64():
    return _llama64(torch.float32)


def _two_requests(model, cfg, kv_dtype, dtype: torch.dtype):
    """Request A: a 9-token chunk, then 7 more over its cached prefix beside request B's 6 fresh
    tokens, on an FP8 pool with SCALES: (harness, A, B, the second forward's logits)."""
    pool = MHATokenToKVPool(256, 1, dtype, 2, 64, cfg.num_hidden_layers, kv_dtype=kv_dtype)
    for layer in range(cfg.num_hidden_layers):
        pool.set_kv_scales(layer, *SCALES)
    h = ForwardHarness(cfg, dtype, max_total_tokens=256, max_context_len=128, attention_backend="cpu")
    h.token_to_kv_pool = pool
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in (16, 6)]
    a, b = h.new_request(), h.new_request()
    h.forward(model, [(a, prompts[0][:9])])
    return h, a, b, h.forward(model, [(a, prompts[0][9:]), (b, prompts[1])]).next_token_logits


def _greedy(model, cfg, kv_dtype) -> tuple[list[int], torch.Tensor]:
    """`_two_requests`, then 8 batched greedy decode steps: the tokens and each step's logits."""
    h, a, b, logits = _two_requests(model, cfg, kv_dtype, torch.float32)
    tokens, steps = [], []
    for _ in range(8):
        nxt = [int(t) for t in logits.argmax(dim=-1)]
        tokens.extend(nxt)
        logits = h.forward(model, [(a, [nxt[0]]), (b, [nxt[1]])]).next_token_logits
        steps.append(logits)
    return tokens, torch.stack(steps)


def _fixed_steps(model, cfg, kv_dtype) -> torch.Tensor:
    """`_two_requests` in bf16, then 6 batched decode steps on fixed tokens: every step's logits
    (the chunk's first)."""
    h, a, b, logits = _two_requests(model, cfg, kv_dtype, torch.bfloat16)
    steps = [logits]
    for t in range(6):
        steps.append(h.forward(model, [(a, [5 + t]), (b, [9 + t])]).next_token_logits)
    return torch.stack(steps).float()


@pytest.mark.parametrize("name", list(KV_DTYPES))
def test_backend_fp8_pool_fused_equals_torch_path(llama64, monkeypatch, name):
    """The `cpu` backend's decode, and its float32 prefill of a chunk over a cached prefix where the
    build has the vector kernel, run the fused kernels on the 1-byte pool, and give the greedy tokens
    (and logits, to float32 summation order) of its torch path."""
    module = loader.load()
    if module is None:
        pytest.skip("no CPU kernels here")
    model, cfg = llama64
    kv_dtype = KV_DTYPES[name]
    spy = _Spy(module)
    monkeypatch.setattr(cpu_backend, "kernels_for_device", lambda device: spy)
    fused_tokens, fused_logits = _greedy(model, cfg, kv_dtype)
    assert spy.decode_dtypes and set(spy.decode_dtypes) == {kv_dtype}
    if module.prefill_attention_vec_supported():
        assert spy.prefix_dtypes and set(spy.prefix_dtypes) == {kv_dtype}
    monkeypatch.setattr(cpu_backend, "kernels_for_device", lambda device: None)
    torch_tokens, torch_logits = _greedy(model, cfg, kv_dtype)
    assert fused_tokens == torch_tokens
    # Not to 1e-5: each step writes its new K / V rounded to FP8, and a summation-order difference
    # can move a value across a rounding boundary (e5m2 keeps 2 mantissa bits), which later steps
    # carry (seen: 5e-2 after 8 steps). Unapplied scales (0.05 / 0.03) would differ by far more.
    assert float((fused_logits - torch_logits).abs().max()) < 0.25


@pytest.mark.parametrize("kv_dtype", list(KV_DTYPES.values()))
def test_bf16_model_fp8_pool_takes_the_bf16_dot_kernels(monkeypatch, kv_dtype):
    module = loader.load()
    if module is None or not module.prefill_attention_vec_supported():
        pytest.skip("no vector CPU kernel build here")
    model, cfg = _llama64(torch.bfloat16)
    spy = _Spy(module, amx=False)
    monkeypatch.setattr(cpu_backend, "prefill_attention_dtype", lambda device, dtype: torch.bfloat16)
    monkeypatch.setattr(cpu_backend, "decode_bf16_dot", lambda device: True)
    monkeypatch.setattr(cpu_backend, "kernels_for_device", lambda device: spy)
    fused = _fixed_steps(model, cfg, kv_dtype)
    assert spy.decode and set(spy.decode) == {(kv_dtype, True)}
    assert spy.prefix and set(spy.prefix) == {(kv_dtype, True)}
    monkeypatch.setattr(cpu_backend, "kernels_for_device", lambda device: None)
    torch_path = _fixed_steps(model, cfg, kv_dtype)
    # The chunk over the FP8 prefix (step 0): bf16 activations, P rounded to bf16 in the kernel, a
    # few bf16 ulps of logits this size (seen: 1.3 %). Each later step writes its K / V rounded to
    # FP8, where a bf16-sized difference can cross an e4m3 / e5m2 rounding step and later steps
    # carry it (seen: 5 %; the same model on a bf16 pool: 1.8 %). Unapplied scales (0.05 / 0.03)
    # or misread codes move the logits by their whole size.
    scale = float(torch_path.abs().max())
    assert scale > 0.5
    torch.testing.assert_close(fused[0], torch_path[0], atol=0.03 * scale, rtol=0)
    torch.testing.assert_close(fused, torch_path, atol=0.1 * scale, rtol=0)
