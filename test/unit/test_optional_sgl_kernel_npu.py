"""sgl-kernel-npu is optional (it is not on PyPI, so setup.py cannot declare it): SGLang imports
and merges partial attentions without it (torch), the `dsa` backend refuses with an error naming
the package; where it is installed, its merge and the torch one agree."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from sglang.srt.layers.attention.ops import merge

# sgl_kernel_npu made unimportable (a None entry in sys.modules), then what a plain install runs
WITHOUT = """
import sys
sys.modules["sgl_kernel_npu"] = None
import torch
import sglang
from sglang.srt.layers.attention.ops import merge_state
from sglang.srt.layers.attention.ops.merge import merge_state_torch
from sglang.srt.layers.attention import registry
import sglang.srt.models.deepseek_v2, sglang.srt.models.llama, sglang.srt.models.qwen3_moe  # import without it
outs = [torch.randn(2, 3, 8), torch.randn(2, 3, 8)]
lses = [torch.randn(2, 3), torch.full((2, 3), float("-inf"))]
out, lse = merge_state(outs, lses)
ref, ref_lse = merge_state_torch(outs, lses)
assert torch.equal(out, ref) and torch.equal(lse, ref_lse) and torch.allclose(out, outs[0])
dsa = registry.get_attention_backend_class("dsa")  # the backend's module imports too...
try:
    dsa(None, prefill_impl="reference", decode_impl="reference")  # ...and refuses to start
except ImportError as exc:
    print("REFUSED", exc)
"""


def test_sglang_runs_without_sgl_kernel_npu_and_dsa_names_it():
    out = subprocess.run([sys.executable, "-c", WITHOUT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 1
    assert (
        "sgl-kernel-npu" in refused[0]
        and "pip install --no-build-isolation -e ./sgl-kernel-npu" in refused[0]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_merge_matches_the_kernel_merge(dtype):
    skn = pytest.importorskip("sgl_kernel_npu")
    g = torch.Generator().manual_seed(0)
    outs = [torch.randn(4, 5, 16, generator=g).to(dtype) for _ in range(3)]
    lses = [torch.randn(4, 5, generator=g) * 4 for _ in range(3)]
    lses[1][0, 0] = float("-inf")  # one part saw no key of a query
    for part in lses:  # and no part saw any key of another
        part[2, 3] = float("-inf")
    want_out, want_lse = skn.merge_attn_states([o.clone() for o in outs], lses, impl="reference")
    out, lse = merge.merge_state_torch(outs, lses)
    assert out.dtype == dtype and lse.dtype == torch.float32
    torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        out.float(), want_out.float(), rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5
    )
    assert torch.isinf(lse[2, 3]) and lse[2, 3] < 0 and torch.equal(out[2, 3].float(), torch.zeros(16))
