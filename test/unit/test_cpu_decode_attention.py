"""Decode attention's AVX-512 paths (kernels/cpu/csrc/sglang_cpu_ops.cpp: 16-key score blocks, one
parallel region for unsplit batches, a bf16 pool's scores by vdpbf16ps under `bf16_dot`) against the torch reference, once per instruction-set build
this CPU executes (the other builds run their own paths on the same inputs)."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.kernels.cpu import reference as ref

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    assert a.dtype == b.dtype == dtype and a.shape == b.shape
    torch.testing.assert_close(a.float(), b.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 80])
@pytest.mark.parametrize("heads", [(9, 3), (8, 1), (4, 4)])
def test_decode_attention_unsplit_batch(ops, dtype, head_dim, heads):
    """A decode batch whose requests are all short enough (<= 256 keys) for one task per (request,
    kv head): each task normalises its own rows (no merge pass). Lengths below, at and past the
    AVX-512 path's 16-key blocks, so the blocks' scalar tails run too."""
    hq, hk = heads
    g = torch.Generator().manual_seed(3 * head_dim + hq)
    rows = 1200
    k_buf = torch.randn(hk, rows, head_dim, generator=g).to(dtype)
    v_buf = torch.randn(hk, rows, head_dim, generator=g).to(dtype)
    lens = torch.tensor([1, 15, 16, 17, 33, 200, 256, 250])
    slots = torch.stack([torch.randperm(rows, generator=g)[:256] for _ in lens])
    q = torch.randn(len(lens), hq, head_dim, generator=g).to(dtype)
    want = ref.decode_attention(q, k_buf, v_buf, slots, lens, head_dim**-0.5)
    for dot in (False, True):  # bf16_dot: a bf16 pool's scores by vdpbf16ps (avx512bf16 build)
        _close(ops.decode_attention(q, k_buf, v_buf, slots, lens, head_dim**-0.5, bf16_dot=dot), want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 80])
def test_decode_attention_nan_propagates(ops, dtype, head_dim):
    """A NaN in one key row makes its requests' outputs NaN (torch's softmax does), for a key in a
    16-key block and one in a block's tail; the other requests stay finite and close."""
    g = torch.Generator().manual_seed(11 + head_dim)
    hk, hq, rows = 2, 4, 300
    k_buf = torch.randn(hk, rows, head_dim, generator=g)
    v_buf = torch.randn(hk, rows, head_dim, generator=g)
    k_buf[0, 5, 3] = float("nan")  # kv head 0 only
    k_buf[1, 250, 0] = float("nan")  # kv head 1 only
    lens = torch.tensor([40, 19, 30])
    slots = torch.stack([torch.randperm(rows - 1, generator=g)[:40] + 1 for _ in range(3)])
    slots[0, 3] = 5  # in the first 16-key block
    slots[1, 17] = 250  # in the tail of a 19-key sequence
    q = torch.randn(3, hq, head_dim, generator=g).to(dtype)
    k_buf, v_buf = k_buf.to(dtype), v_buf.to(dtype)
    want = ref.decode_attention(q, k_buf, v_buf, slots, lens, head_dim**-0.5)
    for dot in (False, True):
        out = ops.decode_attention(q, k_buf, v_buf, slots, lens, head_dim**-0.5, bf16_dot=dot)
        assert want.isnan().any() and torch.equal(out.isnan(), want.isnan())
        fin = want.isfinite()
        assert fin.any() and torch.equal(out.isfinite(), fin)
        torch.testing.assert_close(out[fin].float(), want[fin].float(), atol=TOL[dtype], rtol=TOL[dtype])
