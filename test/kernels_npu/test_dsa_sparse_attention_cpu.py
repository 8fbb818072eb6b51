"""sgl_kernel_npu DSA sparse attention and state merging: the torch reference against float64 math
from the definition, and the fused CPU kernels against the reference on every instruction set this
CPU can run (the lower builds forced on a machine that has the higher ones), float32 and bfloat16;
the causal limit and `sparse_mode`. (The indexer's: test_dsa_ops_cpu.py.)
"""

from __future__ import annotations

import pytest
import torch

import sgl_kernel_npu as skn
from dsa_cases import SFA_CASES, sfa_case
from sgl_kernel_npu import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="sgl_kernel_npu built without its CPU kernels")

ISAS = cpu.supported_isas() if cpu.available() else []


@pytest.fixture(params=ISAS)
def isa(request):
    with cpu.force_isa(request.param):
        assert cpu.active_isa() == request.param
        yield request.param


# ----------------------------------------------------------------------------- sparse attention
def exact_sfa(q, key, idx, kw, scale):
    """float64 per query, straight from the definition."""
    table, bs = kw["block_table"], key.shape[1]
    q_lens = torch.diff(
        torch.cat([torch.zeros(1, dtype=torch.long), kw["actual_seq_lengths_query"].long()])
    ).tolist()
    flat = key.reshape(-1, key.shape[-1]).double()
    rope = kw["key_rope"].reshape(-1, kw["key_rope"].shape[-1]).double()
    outs, lses, t = [], [], 0
    for b, q_len in enumerate(q_lens):
        for _ in range(q_len):
            pos = torch.tensor([int(p) for p in idx[t, 0] if p >= 0], dtype=torch.long)
            if pos.numel() == 0:
                outs.append(torch.zeros(q.shape[1], key.shape[-1], dtype=torch.float64))
                lses.append(torch.full((q.shape[1],), float("-inf"), dtype=torch.float64))
                t += 1
                continue
            rows = table[b, pos // bs].long() * bs + pos % bs
            s = (q[t].double() @ flat[rows].T + kw["query_rope"][t].double() @ rope[rows].T) * scale
            outs.append(torch.softmax(s, -1) @ flat[rows])
            lses.append(torch.logsumexp(s, -1))
            t += 1
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("spec", SFA_CASES)
def test_reference_sparse_attention_exact(spec):
    q, key, idx, kw = sfa_case(**spec)
    out, lse = skn.sparse_flash_attention(q, key, key, idx, 0.3, **kw, impl="reference")
    eo, el = exact_sfa(q, key, idx, kw, 0.3)
    torch.testing.assert_close(out.double(), eo, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), el, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", SFA_CASES)
def test_cpu_sparse_attention(isa, spec):
    q, key, idx, kw = sfa_case(**spec)
    ro, rl = skn.sparse_flash_attention(q, key, key, idx, 0.3, **kw, impl="reference")
    co, cl = skn.sparse_flash_attention(q, key, key, idx, 0.3, **kw, impl="cpu")
    torch.testing.assert_close(co, ro, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(cl, rl, atol=2e-6, rtol=1e-5)
    # a request whose queries outnumber its keys: its first query sees none (out 0, lse -inf)
    if spec["kv_lens"][0] < spec["q_lens"][0]:
        assert torch.isinf(cl[0]).all() and (co[0] == 0).all()


def test_cpu_sparse_attention_bf16(isa):
    q, key, idx, kw = sfa_case(**SFA_CASES[1], dtype=torch.bfloat16)
    ro, rl = skn.sparse_flash_attention(q, key, key, idx, 0.2, **kw, impl="reference")
    co, cl = skn.sparse_flash_attention(q, key, key, idx, 0.2, **kw, impl="cpu")
    assert co.dtype == torch.bfloat16
    torch.testing.assert_close(co.float(), ro.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(cl, rl, atol=1e-4, rtol=1e-4)


def test_sparse_attention_causal_limit_ignores_future_indices():
    """sparse_mode 3 ignores an index past the query's causal limit (sparse_mode 0 uses it)."""
    q, key, idx, kw = sfa_case(q_lens=[4], kv_lens=[4], topk=4)
    idx = torch.arange(4, dtype=torch.int32).repeat(4, 1).unsqueeze(1)  # every query names every key
    for impl in ["reference"] + (["cpu"] if ISAS else []):
        o3, l3 = skn.sparse_flash_attention(q, key, key, idx, 0.5, **kw, impl=impl)
        limited = torch.where(torch.arange(4).unsqueeze(1) <= torch.arange(4).unsqueeze(0), idx[:, 0].T, -1).T
        ol, ll = skn.sparse_flash_attention(
            q, key, key, limited.unsqueeze(1).contiguous(), 0.5, **kw, impl=impl
        )
        torch.testing.assert_close(o3, ol)
        o0, _ = skn.sparse_flash_attention(q, key, key, idx, 0.5, **{**kw, "sparse_mode": 0}, impl=impl)
        assert not torch.allclose(o0[0], o3[0])


# ----------------------------------------------------------------------------------------- merge
def test_merge_matches_one_softmax_and_cpu(isa):
    gen = torch.Generator().manual_seed(2)
    scores = torch.randn(3, 5, 7, 20, generator=gen)  # [parts... as key blocks] -> split keys in 3 parts
    values = torch.randn(20, 24, generator=gen)
    parts = [(0, 6), (6, 13), (13, 20)]
    outs, lses = [], []
    for a, b in parts:
        s = scores[..., a:b]
        outs.append(torch.softmax(s, -1) @ values[a:b])
        lses.append(torch.logsumexp(s, -1))
    lses[1][0, 0, 0] = float("-inf")  # part 1 saw no key of one query
    outs[1][0, 0, 0] = 0.0
    for p in range(3):  # and one query no part saw
        lses[p][1, 2, 3] = float("-inf")
    whole = torch.cat([scores[..., a:b] for (a, b) in parts if (a, b) != (6, 13)], -1)
    ref_o, ref_l = skn.merge_attn_states([o.clone() for o in outs], lses, impl="reference")
    cpu_o, cpu_l = skn.merge_attn_states(outs, lses, impl="cpu")
    torch.testing.assert_close(cpu_o, ref_o, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cpu_l, ref_l, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ref_l[0, 0, 0], torch.logsumexp(whole[0, 0, 0], -1))
    assert torch.isinf(ref_l[1, 2, 3]) and (ref_o[1, 2, 3] == 0).all() and (cpu_o[1, 2, 3] == 0).all()
    full = torch.softmax(scores, -1) @ values
    torch.testing.assert_close(ref_o[2], full[2], atol=1e-5, rtol=1e-5)
