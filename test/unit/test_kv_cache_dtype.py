"""`--kv-cache-dtype`: the flag's values, the start-up refusal with a backend that cannot read FP8,
capacity from bytes per token, checkpoint KV scales, and PD / HiCache carrying the 1-byte cache as
stored. Model parity: test/models/test_kv_cache_fp8.py; cp 2: test/distributed/test_cp_kv_fp8.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from sglang.srt.layers.attention.registry import check_kv_cache_dtype
from sglang.srt.mem_cache.hicache.host_pool import TokenLayout, kv_token_buffers
from sglang.srt.mem_cache.kv_dtype import (
    apply_kv_scales,
    kv_scale_target,
    read_kv_scales,
    resolve_kv_cache_dtype,
)
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.mla_kv_pool import DSATokenToKVPool
from sglang.srt.mem_cache.transfer_layout import copy_plan, kv_regions, slot_runs
from sglang.srt.model_executor.memory_budget import MemoryReading, plan_kv_pool
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.test.tiny_models import TINY_LLAMA_DIR

FP8 = torch.float8_e4m3fn


def test_flag_values_and_refusals():
    args = prepare_server_args(["--model-path", TINY_LLAMA_DIR, "--kv-cache-dtype", "fp8_e5m2"])
    assert args.kv_cache_dtype == "fp8_e5m2"
    assert ServerArgs(model_path=TINY_LLAMA_DIR).kv_cache_dtype == "auto"
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        prepare_server_args(["--model-path", TINY_LLAMA_DIR, "--kv-cache-dtype", "fp8"])
    with pytest.raises(ValueError, match="--kv-cache-dtype must be one of"):
        ServerArgs(model_path=TINY_LLAMA_DIR, kv_cache_dtype="int8").validate()
    assert resolve_kv_cache_dtype("auto", torch.float32) == torch.float32
    assert resolve_kv_cache_dtype("bf16", torch.float32) == resolve_kv_cache_dtype("bfloat16", torch.float32)
    assert resolve_kv_cache_dtype("fp8_e4m3", torch.bfloat16) == FP8
    with pytest.raises(ValueError, match="--kv-cache-dtype"):
        resolve_kv_cache_dtype("fp4", torch.float32)


def test_backend_without_fp8_reads_refused_naming_both(monkeypatch):
    for name in ("cpu", "torch_native", "intel_amx", "dsa", "nsa"):
        check_kv_cache_dtype(name, "fp8_e4m3")
    from sglang.srt.layers.attention.dsa_backend import DSAAttnBackend

    monkeypatch.setattr(DSAAttnBackend, "supports_fp8_kv", False)  # a backend that cannot read FP8
    with pytest.raises(
        ValueError, match="--kv-cache-dtype fp8_e4m3 is not supported with --attention-backend dsa"
    ):
        check_kv_cache_dtype("dsa", "fp8_e4m3")
    check_kv_cache_dtype("dsa", "bf16")


def test_capacity_doubles_at_the_same_memory_budget():
    """Pool tokens = budget / bytes per token: a 1-byte cache holds twice the bf16 tokens under
    --mem-fraction-static (and under the CPU rule when its RAM cap binds); --max-total-tokens
    fixes the tokens and halves the bytes instead."""
    cell = {d: MHATokenToKVPool.cell_size_bytes(2, 64, 30, d) for d in (torch.bfloat16, FP8)}
    assert cell[torch.bfloat16] == 2 * cell[FP8]
    mem = MemoryReading(free_before_load=8 << 30, free_after_load=7 << 30)
    mla = {d: DSATokenToKVPool.cell_size_bytes(512, 64, 4, torch.bfloat16, kv_dtype=d) for d in cell}
    assert mla[torch.bfloat16] == 2 * mla[FP8]

    class Cfg:
        context_len = 1 << 20  # four contexts above the RAM cap: the cap binds

    for args in (ServerArgs(mem_fraction_static=0.5), ServerArgs()):
        tokens = {d: plan_kv_pool(args, Cfg, cell[d], mem).max_total_tokens for d in cell}
        assert abs(tokens[FP8] - 2 * tokens[torch.bfloat16]) <= 2 * args.page_size
    pools = {d: MHATokenToKVPool(64, 1, torch.bfloat16, 2, 16, 2, kv_dtype=d) for d in cell}
    assert pools[torch.bfloat16].mem_bytes() == 2 * pools[FP8].mem_bytes()


def test_kv_scales_only_on_fp8_pools():
    """A bf16 pool stores values unscaled (and the kernels read them so): a scale is refused."""
    pool = MHATokenToKVPool(8, 1, torch.bfloat16, 1, 4, 1)
    with pytest.raises(ValueError, match="FP8 pools"):
        pool.set_kv_scales(0, 2.0, 0.5)
    assert pool.kv_scales(0) == (1.0, 1.0)


def test_quantize_saturates_and_scales():
    pool = MHATokenToKVPool(8, 1, torch.float32, 1, 4, 1, kv_dtype=FP8)
    pool.set_kv_scales(0, 2.0, 0.5)
    x = torch.tensor([[[1e6, -1e6, 3.0, 0.1]]])
    pool.set_kv_buffer(0, torch.tensor([3]), x, x)
    k, v = pool.get_kv_buffer(0)
    limit = torch.finfo(FP8).max
    assert k[3].float().tolist() == [[limit, -limit, 1.5, float((x[0, 0, 3] / 2).to(FP8))]]
    assert v[3].float().tolist()[0][:2] == [limit, -limit]  # saturated, not NaN


def test_checkpoint_kv_scales_read_and_skipped_by_the_loader(tmp_path):
    names = {
        "model.layers.0.self_attn.k_scale": (0, "k"),
        "model.layers.0.self_attn.v_scale": (0, "v"),
        "model.layers.1.self_attn.attn.k_scale": (1, "k"),
        "model.layers.2.self_attn.kv_scale": (2, "kv"),
        "model.layers.3.self_attn.v_proj.output_scale": (3, "v"),
    }
    for name, target in names.items():
        assert kv_scale_target(name) == target
    assert kv_scale_target("model.layers.0.self_attn.k_proj.weight_scale_inv") is None
    save_file({n: torch.tensor(0.25 + i) for i, n in enumerate(names)}, str(tmp_path / "model.safetensors"))
    scales = read_kv_scales(str(tmp_path))
    assert scales == {0: (0.25, 1.25), 1: (2.25, None), 2: (3.25, 3.25), 3: (None, 4.25)}
    pool = MHATokenToKVPool(8, 1, torch.float32, 1, 4, 3, start_layer=1, kv_dtype=FP8)
    assert apply_kv_scales(pool, scales) == 3
    assert [pool.kv_scales(i) for i in (1, 2, 3)] == [(2.25, 1.0), (3.25, 3.25), (1.0, 4.25)]
    unscaled = MHATokenToKVPool(8, 1, torch.float32, 1, 4, 3)
    assert apply_kv_scales(unscaled, scales) == 0 and unscaled.kv_scales(2) == (1.0, 1.0)

    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.configs.model_config import ModelConfig

    cfg = ModelConfig(TINY_LLAMA_DIR).hf_config
    model = ModelRegistry.resolve(cfg.architectures)(cfg, None, torch.float32)
    weights = [(n, p.detach().clone()) for n, p in model.named_parameters()]
    weights.append(("model.layers.0.self_attn.k_scale", torch.tensor(0.5)))
    assert "model.layers.0.self_attn.k_scale" not in model.load_weights(weights)


def _filled_fp8_pool(heads: int, seed: int) -> MHATokenToKVPool:
    pool = MHATokenToKVPool(32, 4, torch.float32, heads, 8, 2, kv_dtype=FP8)
    g = torch.Generator().manual_seed(seed)
    for layer in range(2):
        slots = torch.arange(4, 36)
        k, v = torch.randn(32, heads, 8, generator=g), torch.randn(32, heads, 8, generator=g)
        pool.set_kv_buffer(layer, slots, k, v)
    return pool


def test_pd_transfer_moves_the_one_byte_cache_as_stored():
    src = _filled_fp8_pool(4, seed=0)
    dst = MHATokenToKVPool(32, 4, torch.float32, 4, 8, 2, kv_dtype=FP8)
    regions = kv_regions(src)
    assert all(r.slot_bytes == 8 and r.dtype == "float8_e4m3fn" for r in regions)
    src_slots, dst_slots = np.array([5, 6, 7, 20]), np.array([9, 10, 11, 30])
    for s, d, n in zip(*copy_plan(regions, kv_regions(dst), slot_runs(src_slots, dst_slots))):
        ctypes.memmove(d, s, n)
    for layer in range(2):
        for a, b in zip(src.get_kv_buffer_head_major(layer), dst.get_kv_buffer_head_major(layer)):
            assert torch.equal(a[:, src_slots].view(torch.uint8), b[:, dst_slots].view(torch.uint8))
    wide = MHATokenToKVPool(32, 4, torch.bfloat16, 4, 8, 2)
    with pytest.raises(ValueError, match="KV layout mismatch"):
        copy_plan(regions, kv_regions(wide), slot_runs(src_slots, dst_slots))


def test_hicache_pages_carry_the_one_byte_cache():
    pool = _filled_fp8_pool(2, seed=1)
    buffers = kv_token_buffers(pool)
    layout = TokenLayout(buffers)
    assert layout.token_bytes() == 2 * 2 * 2 * 8  # layers x (k, v) x heads x head_dim, 1 byte each
    slots = torch.tensor([4, 5, 9])
    data = layout.pack(buffers, slots)
    assert len(data) == 3 * layout.token_bytes()
    host = [torch.zeros_like(b) for b in buffers]
    layout.unpack_into(host, torch.tensor([1, 2, 3]), data)
    for b, h in zip(buffers, host):
        assert h.dtype == FP8 and torch.equal(b[slots].view(torch.uint8), h[1:4].view(torch.uint8))


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_widen_equals_torch_cast_on_every_finite_code(fp8):
    """`widen_kv`'s bit-moving FP8 widening: exactly torch's cast (times the scale) for all 256
    codes but NaN / inf (never stored: writes saturate), subnormals and -0 included, any layout."""
    from sglang.srt.layers.attention.kv_source import widen_kv

    codes = torch.arange(256, dtype=torch.uint8).view(fp8)
    finite = torch.isfinite(codes.float())
    for dtype in (torch.bfloat16, torch.float32):
        for scale in (1.0, 0.37):
            got = widen_kv(codes, dtype, scale)[finite]
            ref = codes.to(dtype)[finite] * scale
            bits = torch.int16 if dtype == torch.bfloat16 else torch.int32  # bitwise: -0.0 too
            assert got.dtype == dtype and torch.equal(got.view(bits), ref.view(bits))
    rows = codes[finite][:120].reshape(2, 6, 10).transpose(0, 1)  # not contiguous
    assert torch.equal(widen_kv(rows, torch.float32), rows.float())
