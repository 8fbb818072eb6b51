"""The `cpu` backend's fast paths (fused kernels, pool views, workspace gathers, split prefix,
decode runs) against the `torch_native` reference backend, both run on the same batch; the
reference itself is checked against plain float32 math (per request, K/V gathered through the
token-major pool API, offset-causal softmax)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import pytest
import torch

from sglang.srt.layers.attention import cpu_backend, cpu_decode
from sglang.srt.layers.attention.cpu_backend import CPUAttnBackend, CPUMetadata
from sglang.srt.layers.attention.cpu_decode import plan_decode_segments
from sglang.srt.layers.attention.kv_source import KVGather, KVRun, KVWorkspace, contiguous_run, fetch
from sglang.srt.layers.attention.ops import attention_with_lse, causal_mask
from sglang.srt.layers.attention.radix_attention import RadixAttention
from sglang.srt.layers.attention.torch_native import TorchNativeAttnBackend
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.kv_pool import MHATokenToKVPool
from sglang.srt.mem_cache.req_to_token import ReqToTokenPool
from sglang.srt.model_executor.forward_batch import ForwardBatch, ForwardMode
from sglang.srt.platforms import fresh_platforms
from sglang.srt.platforms import kernel_dispatch as dispatch

HQ, HK, D, LAYERS = 4, 2, 8, 2
ROWS = 512


@pytest.fixture(autouse=True, params=["torch", "fused"])
def decode_impl(request, monkeypatch):
    """Every test runs twice: with the torch paths alone (SGLANG_CPU_KERNELS=0, what platforms
    without fused kernels run) and with the CPU build's fused decode attention where it builds."""
    monkeypatch.setenv("SGLANG_CPU_KERNELS", "0" if request.param == "torch" else "1")
    with fresh_platforms():  # platform objects that read the variable
        if request.param == "fused" and dispatch.kernels_for_device(torch.device("cpu")) is None:
            pytest.skip("no C++ toolchain: the fused CPU kernels could not be built")
        yield request.param


def _layers() -> list[RadixAttention]:
    return [RadixAttention(HQ, D, D**-0.5, HK, i) for i in range(LAYERS)]


def _world(page_size: int = 1, dtype: torch.dtype = torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pool = MHATokenToKVPool(ROWS, page_size, dtype, HK, D, LAYERS)
    for b in (*pool.k_head_major, *pool.v_head_major):  # every slot holds some cached K/V
        b.copy_(torch.randn(b.shape, generator=g).to(dtype))
    return pool, ReqToTokenPool(8, ROWS), g


def _batch(pool, r2t, slots: Sequence[Sequence[int]], ext: Sequence[int], backend=None) -> ForwardBatch:
    """Request i owns slots[i] (its whole sequence) and brings its last ext[i] tokens now; run by
    `backend` (default: a fresh `cpu` backend)."""
    seq = [len(s) for s in slots]
    prefix = [n - e for n, e in zip(seq, ext)]
    for i, s in enumerate(slots):
        r2t.req_to_token[i, : len(s)] = torch.tensor(list(s))
    out_loc = torch.tensor([x for s, e in zip(slots, ext) for x in list(s)[len(s) - e :]], dtype=torch.int64)
    decode = all(e == 1 for e in ext) and all(prefix)
    i64 = dict(dtype=torch.int64)
    return ForwardBatch(
        ForwardMode.DECODE if decode else ForwardMode.MIXED if 1 in ext else ForwardMode.EXTEND,
        len(slots),
        torch.zeros(sum(ext), **i64),
        torch.cat([torch.arange(p, n) for p, n in zip(prefix, seq)]),
        out_loc,
        torch.arange(len(slots), **i64),
        torch.tensor(seq, **i64),
        torch.tensor(prefix, **i64),
        torch.tensor(list(ext), **i64),
        seq,
        prefix,
        list(ext),
        r2t,
        pool,
        backend if backend is not None else CPUAttnBackend(),
    )


def _reference(pool, fb: ForwardBatch, layer: RadixAttention, q: torch.Tensor) -> torch.Tensor:
    kb, vb = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
    outs, start = [], 0
    for i in range(fb.batch_size):
        n, seq, pre = fb.extend_seq_lens_cpu[i], fb.seq_lens_cpu[i], fb.extend_prefix_lens_cpu[i]
        slots = fb.req_to_token_pool.req_to_token[i, :seq]
        k = kb[slots].float().transpose(0, 1)  # [Hk, seq, D]
        v = vb[slots].float().transpose(0, 1)
        qi = q[start : start + n].view(n, HQ, D).float().transpose(0, 1)
        o, _ = attention_with_lse(qi, k, v, layer.scaling, attn_mask=causal_mask(n, seq, pre))
        outs.append(o.transpose(0, 1).reshape(n, HQ * D))
        start += n
    return torch.cat(outs)


def _oracle_batch(fb: ForwardBatch) -> ForwardBatch:
    """The same batch (same pool, slots and tokens) run by the torch_native reference backend."""
    return dataclasses.replace(fb, attn_backend=TorchNativeAttnBackend(), attn_metadata=None)


def _check(pool, fb: ForwardBatch, g: torch.Generator, atol: float = 1e-5) -> CPUMetadata:
    """Run every layer through the fast backend and the reference (each saving the same new k/v)
    and compare them; the reference is also compared to plain float32 math."""
    ref = _oracle_batch(fb)
    fb.attn_backend.init_forward_metadata(fb)
    ref.attn_backend.init_forward_metadata(ref)
    t = fb.num_tokens
    for layer in _layers():
        q = torch.randn(t, HQ * D, generator=g).to(pool.dtype)
        k = torch.randn(t, HK * D, generator=g).to(pool.dtype)
        v = torch.randn(t, HK * D, generator=g).to(pool.dtype)
        expect = ref.attn_backend.forward(q, k, v, layer, ref)
        out = fb.attn_backend.forward(q, k, v, layer, fb)
        torch.testing.assert_close(out.float(), expect.float(), atol=atol, rtol=atol)
        torch.testing.assert_close(expect.float(), _reference(pool, fb, layer, q), atol=atol, rtol=atol)
    return fb.attn_metadata.fast


def _runs(*ranges: tuple[int, int]) -> list[int]:
    return [x for a, b in ranges for x in range(a, b)]


# ---------------------------------------------------------------------------- planning units
def test_contiguous_run_detection():
    assert contiguous_run(torch.tensor([5, 6, 7, 8])) == KVRun(5, 4)
    assert contiguous_run(torch.tensor([9])) == KVRun(9, 1)
    assert contiguous_run(torch.tensor([5, 6, 8, 9])) is None
    assert contiguous_run(torch.tensor([5, 7, 6, 8])) is None  # right span, wrong order
    assert contiguous_run(torch.tensor([], dtype=torch.int64)) is None


def test_fetch_view_and_workspace_gather():
    buf = torch.randn(2, 20, 3)
    view = fetch(buf, KVRun(4, 5), None, "k")
    assert view.data_ptr() == buf[:, 4].data_ptr() and torch.equal(view, buf[:, 4:9])
    ws = KVWorkspace()
    idx = torch.tensor([3, 1, 7])
    a = fetch(buf, KVGather(idx), ws, "k")
    assert torch.equal(a, buf[:, idx])
    b = fetch(buf, KVGather(torch.tensor([2, 2])), ws, "k")  # reuses the same storage
    assert b.data_ptr() == a.data_ptr() and torch.equal(b, buf[:, [2, 2]])


def test_pool_is_head_major_with_token_major_views():
    pool = MHATokenToKVPool(16, 4, torch.float32, HK, D, 1)
    loc = torch.tensor([5, 2, 9])
    k, v = torch.randn(3, HK, D), torch.randn(3, HK * D)
    pool.set_kv_buffer(0, loc, k, v)
    kh, vh = pool.get_kv_buffer_head_major(0)
    assert kh.shape == (HK, 20, D) and kh.is_contiguous()
    assert torch.equal(kh[:, loc].transpose(0, 1), k)
    assert torch.equal(pool.get_value_buffer(0)[loc], v.view(3, HK, D))
    assert pool.get_key_buffer(0).data_ptr() == kh.data_ptr()


def test_plan_decode_segments_partitions_every_slot():
    kv = torch.tensor(
        [
            _runs((10, 16), (40, 41), (60, 66), (90, 92)),  # two long runs + scattered
            _runs((100, 106)) + [0] * 9,  # all one run: shortened so one slot is gathered
            _runs((200, 202), (300, 302)) + [0] * 11,  # no long run: all gathered
        ]
    )
    lens = [15, 6, 4]
    plan = plan_decode_segments(kv, lens, min_run=5)
    assert plan is not None
    assert plan.seg_row == [0, 0, 1] and plan.seg_start == [10, 60, 100] and plan.seg_len == [6, 6, 5]
    tail = plan.tail_indices.view(3, plan.tail_len)
    for i, n in enumerate(lens):
        seg = [
            s + j for r, s, m in zip(plan.seg_row, plan.seg_start, plan.seg_len) if r == i for j in range(m)
        ]
        keep = (
            plan.tail_mask[i, 0, 0]
            if plan.tail_mask is not None
            else torch.ones(plan.tail_len, dtype=torch.bool)
        )
        assert sorted(seg + tail[i][keep].tolist()) == sorted(kv[i, :n].tolist())
    assert [ids for _, ids in plan.rounds] == [[0, 2], [1]]
    assert plan_decode_segments(kv, lens, min_run=7) is None


# ---------------------------------------------------------------------------- backend vs reference
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("min_run", [None, 8])
def test_single_request_decode(monkeypatch, contiguous, min_run, decode_impl):
    if min_run is not None:
        monkeypatch.setattr(cpu_decode, "MIN_RUN", min_run)
    pool, r2t, g = _world()
    slots = list(range(1, 41)) if contiguous else _runs((1, 20), (50, 60), (30, 41), (70, 72))
    md = _check(pool, _batch(pool, r2t, [slots], [1]), g)
    assert isinstance(md.single_source, KVRun if contiguous else KVGather)
    # several runs of one request (a radix-cached prefix + its own pages): views when long enough;
    # the fused kernel reads every slot in place, so it needs no plan
    planned = decode_impl == "torch" and not contiguous and min_run is not None
    assert (md.single_segments is not None) == planned
    assert (md.kernels is not None) == (decode_impl == "fused")


@pytest.mark.parametrize("page_size", [1, 4])
def test_batched_ragged_decode_from_allocator(page_size):
    """Prefill 3 requests together, then decode them interleaved (the scheduler's layout)."""
    pool, r2t, g = _world(page_size)
    alloc = TokenToKVPoolAllocator(ROWS, page_size)
    prompt = [13, 7, 22]
    slots = [list(x) for x in torch.split(alloc.alloc_extend([0] * 3, prompt, [0] * 3), prompt)]
    for step in range(9):
        live = [i for i in range(3) if not (i == 1 and step > 5)]  # request 1 stops early
        new = alloc.alloc_decode([len(slots[i]) + 1 for i in live], [slots[i][-1] for i in live])
        for i, s in zip(live, new.tolist()):
            slots[i].append(s)
    md = _check(pool, _batch(pool, r2t, slots, [1, 1, 1]), g)
    assert md.single_mask is not None and isinstance(md.single_source, KVGather)


@pytest.mark.parametrize("page_size", [1, 4])
def test_decode_runs_as_views(monkeypatch, page_size, decode_impl):
    if decode_impl == "fused":
        pytest.skip("the fused kernel plans no runs (it reads every slot in place)")
    monkeypatch.setattr(cpu_decode, "MIN_RUN", 8)
    pool, r2t, g = _world(page_size)
    slots = [
        _runs((4, 20), (300, 301), (40, 52), (310, 312)),  # two runs + scattered
        _runs((100, 124)),  # one run, with another request in the batch
        _runs((200, 203), (320, 322)),  # short: gathered only
        _runs((140, 150), (330, 331)),  # one run + one slot
    ]
    md = _check(pool, _batch(pool, r2t, slots, [1, 1, 1, 1]), g)
    assert md.single_segments is not None and len(md.single_segments.rounds) == 2
    # uniform case: one run per request, no ragged tail -> merged without scatter
    pool, r2t, g = _world(page_size, seed=1)
    slots = [_runs((10 + 40 * i, 30 + 40 * i), (400 + i, 401 + i)) for i in range(3)]
    md = _check(pool, _batch(pool, r2t, slots, [1, 1, 1]), g)
    assert md.single_segments is not None and md.single_segments.tail_mask is None


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("split", [True, False])
def test_extend_over_cached_prefix(monkeypatch, contiguous, split):
    if not split:
        monkeypatch.setattr(cpu_backend, "lse_kernel_available", lambda q: False)
    pool, r2t, g = _world(4)
    a = list(range(8, 38)) if contiguous else _runs((8, 20), (100, 118))
    b = _runs((200, 209), (60, 66))  # prefix 9 + chunk 6 elsewhere (a radix hit + new pages)
    c = list(range(300, 312))  # no prefix: plain causal over fresh k/v
    d = _runs((400, 420))  # a decode request in the same (mixed) batch
    md = _check(pool, _batch(pool, r2t, [a, b, c, d], [7, 6, 12, 1]), g)
    assert isinstance(md.extends[0].prefix_source, KVRun if contiguous else KVGather)


def test_bfloat16_fast_paths_match_reference(monkeypatch):
    """bf16 pool: the view / split paths agree with the reference's gather + masked SDPA."""
    monkeypatch.setattr(cpu_decode, "MIN_RUN", 8)
    cases = [
        ([list(range(1, 60))], [1]),
        ([_runs((1, 30), (90, 120))], [12]),
        ([_runs((1, 20), (90, 99))], [1]),
    ]
    for slots, ext in cases:
        pool, r2t, g = _world(1, torch.bfloat16, seed=3)
        fb = _batch(pool, r2t, slots, ext)
        ref = _oracle_batch(fb)
        t = fb.num_tokens
        q, k, v = (torch.randn(t, h * D, generator=g).bfloat16() for h in (HQ, HK, HK))
        outs = []
        for batch in (fb, ref):
            batch.attn_backend.init_forward_metadata(batch)
            outs.append(batch.attn_backend.forward(q, k, v, _layers()[1], batch).float())
        torch.testing.assert_close(outs[0], outs[1], atol=2e-2, rtol=2e-2)
