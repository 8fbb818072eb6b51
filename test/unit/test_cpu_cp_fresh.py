"""The CP prefill path of the `cpu` backend (layers/attention/cpu_cp_fresh.py): a FRESH request's
local query runs (zigzag: two per rank) attend causally over the gathered K/V with the fused
prefill kernels, equal to the reference `causal_attention_lse`."""

import pytest
import torch

from sglang.srt.layers.attention.cpu_backend import CPUAttnBackend
from sglang.srt.layers.attention.cpu_cp_fresh import fused_fresh_attention
from sglang.srt.layers.attention.ops import causal_attention_lse, contiguous_runs
from sglang.srt.layers.attention.torch_native import TorchNativeAttnBackend
from sglang.srt.platforms.kernel_dispatch import kernels_for_device

needs_kernels = pytest.mark.skipif(
    kernels_for_device(torch.device("cpu")) is None, reason="the CPU kernels are not built here"
)


def test_contiguous_runs():
    assert contiguous_runs([]) == []
    assert contiguous_runs([0, 1, 2]) == [(0, 3)]
    assert contiguous_runs([0, 1, 5, 6, 7, 9]) == [(0, 2), (2, 5), (5, 6)]


def _zigzag_positions(n: int, cp: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s positions of an n-token prompt split in 2*cp chunks: chunk r and 2cp-1-r."""
    bounds = [n * i // (2 * cp) for i in range(2 * cp + 1)]
    runs = [(bounds[rank], bounds[rank + 1]), (bounds[2 * cp - 1 - rank], bounds[2 * cp - rank])]
    return torch.cat([torch.arange(a, b) for a, b in runs])


@needs_kernels
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("heads,head_dim", [((4, 2), 64), ((2, 2), 128)])
@pytest.mark.parametrize("n,rank", [(301, 0), (301, 1), (96, 1), (7, 0)])
def test_fused_equals_reference(dtype, tol, heads, head_dim, n, rank):
    torch.manual_seed(n + rank)
    h, hk = heads
    q_pos = _zigzag_positions(n, 2, rank)
    q = torch.randn(q_pos.numel(), h, head_dim).to(dtype)
    k, v = torch.randn(n, hk, head_dim).to(dtype), torch.randn(n, hk, head_dim).to(dtype)
    scale = head_dim**-0.5
    ref, _ = causal_attention_lse(q.float(), q_pos, k.float(), v.float(), torch.arange(n), scale)
    got = fused_fresh_attention(q, q_pos, k, v, scale)
    if got is None:
        pytest.skip(f"no fused prefill kernel for {dtype} head dim {head_dim} on this CPU")
    assert got.dtype == dtype and got.shape == ref.shape
    torch.testing.assert_close(got.float(), ref, atol=tol, rtol=tol)


@needs_kernels
def test_float32_always_has_a_kernel_and_the_cpu_backend_uses_it():
    """float32 head dim 64 (the parity tests' CP path) runs fused on every build with AVX2+."""
    q_pos = _zigzag_positions(64, 2, 1)
    q, k = torch.randn(q_pos.numel(), 2, 64), torch.randn(64, 2, 64)
    kernels = kernels_for_device(q.device)
    if not kernels.prefill_attention_vec_supported():
        pytest.skip("the portable build has no vector prefill kernel")
    assert fused_fresh_attention(q, q_pos, k, k.clone(), 0.125) is not None
    assert CPUAttnBackend.cp_fresh_attention is fused_fresh_attention
    assert TorchNativeAttnBackend.cp_fresh_attention is None  # the reference stays the reference


def test_unsorted_or_unfit_inputs_fall_back():
    q_pos = torch.tensor([3, 1, 2])
    q, k = torch.randn(3, 2, 64), torch.randn(4, 2, 64)
    assert fused_fresh_attention(q, q_pos, k, k, 0.1) is None
    odd = torch.randn(3, 2, 48)
    assert (
        fused_fresh_attention(odd, torch.arange(3), torch.randn(3, 2, 48), torch.randn(3, 2, 48), 0.1) is None
    )
