"""The context-parallel attention path on 2 and 4 gloo ranks vs single-rank attention.

An attention-only "model" turns (token id, position) into q/k/v deterministically, runs one
RadixAttention layer through the torch-native backend and returns the attention output of the
whole batch in original order. Batches: ragged fresh prefills (lengths shorter than 2·cp too),
chunk continuations over a cached prefix, decodes, and a request sharing another's prefix (a
radix hit) — under both split strategies, several page / interleave sizes, float32.
The output must match the single-rank backend, and each rank must store only its KV share.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.attention.radix_attention import RadixAttention
from sglang.srt.layers.communicator import scatter_model_input
from sglang.srt.layers.context_parallel import get_cp_layout
from sglang.test.cp_forward_helpers import CPForwardHarness

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines

TOL = 1e-5
HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4, 2, 8, 50
# (strategy, page_size, interleave)
CONFIGS = [("zigzag", 1, 1), ("round-robin", 1, 1), ("zigzag", 4, 2), ("round-robin", 2, 2)]


class _Cfg:
    num_attention_heads, num_key_value_heads, head_dim = HEADS, KV_HEADS, HEAD_DIM
    hidden_size, num_hidden_layers = HEADS * HEAD_DIM, 1


class AttnOnly(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.tables = [torch.randn(VOCAB, n * HEAD_DIM, generator=g) for n in (HEADS, KV_HEADS, KV_HEADS)]
        self.freqs = [torch.rand(t.shape[1], generator=g) for t in self.tables]
        self.attn = RadixAttention(HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS, layer_id=0)

    def forward(self, input_ids, positions, fb):
        ids, pos = scatter_model_input(input_ids, positions, fb)
        q, k, v = (t[ids] * torch.cos(pos.float().unsqueeze(1) * f) for t, f in zip(self.tables, self.freqs))
        self.attn.start_kv_exchange(k, v, fb)
        out = self.attn(q, k, v, fb)
        layout = get_cp_layout(fb)
        return out if layout is None else layout.gather_all(out)


def _workload(h: CPForwardHarness, model: AttnOnly, vps_multiple: int) -> dict:
    g = torch.Generator().manual_seed(3)
    lens = (3, 13, 1, 26, 2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lens]
    reqs = [h.new_request() for _ in prompts]
    outs = []
    # step 1: ragged fresh prefills (the 26-token prompt only its first 9 tokens)
    items = [(r, p if len(p) != 26 else p[:9]) for r, p in zip(reqs, prompts)]
    outs.append(h.forward(model, items))
    # step 2: the long prompt continues over its prefix (twice), the others decode
    for step, chunk in enumerate((prompts[3][9:20], prompts[3][20:])):
        items = [(reqs[3], chunk)] + [(r, [(7 * i + step) % VOCAB]) for i, r in enumerate(reqs) if i != 3]
        outs.append(h.forward(model, items))
    # step 3: a radix hit on the long prompt's first whole virtual pages, plus a 1-token extend
    shared = vps_multiple
    hit = h.new_request(share_prefix_of=reqs[3], prefix_len=shared)
    outs.append(h.forward(model, [(hit, prompts[3][shared:] + [7, 8]), (reqs[0], [9])]))
    # step 4: decodes only
    outs.append(h.forward(model, [(r, [(11 + i) % VOCAB]) for i, r in enumerate(reqs + [hit])]))
    # step 5: a lone 2-token prompt: at cp 4 two ranks hold no token of the batch at all
    lone = h.new_request()
    outs.append(h.forward(model, [(lone, [5, 6])]))
    rows = [r.row for r in reqs + [hit, lone]]
    stored_tokens = len(set(h.req_to_token_pool.req_to_token[rows].flatten().tolist()) - {0})
    return {"outs": outs, "rows": h.stored_rows(), "virtual_tokens": stored_tokens}


def _run(group, strategy: str, page: int, inter: int) -> dict:
    h = CPForwardHarness(_Cfg, group, strategy, page_size=page, interleave=inter, max_total_tokens=1024)
    return _workload(h, AttnOnly(), vps_multiple=16)


def _rank_body(rank: int, world_size: int) -> list[dict]:
    groups = ParallelGroups.build(ParallelLayout(tp=world_size, attn_cp=world_size), rank)
    assert groups.attn_cp.size == world_size and groups.attn_tp.size == 1
    return [_run(groups.attn_cp, *cfg) for cfg in CONFIGS]


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    return [_run(None, *cfg) for cfg in CONFIGS]


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_attention_matches_single_rank(cp, reference):
    results = run_ranks(_rank_body, cp, timeout=120)
    for c, cfg in enumerate(CONFIGS):
        ref = reference[c]
        for rank in range(cp):
            got = results[rank][c]
            assert len(got["outs"]) == len(ref["outs"])
            for step, (a, b) in enumerate(zip(got["outs"], ref["outs"])):
                where = f"{cfg} rank {rank} step {step}"
                torch.testing.assert_close(a, b, atol=TOL, rtol=1e-5, msg=lambda m: f"{where}: {m}")
        # sharded, not replicated: every stored token lives on exactly one rank
        rows = [results[r][c]["rows"] for r in range(cp)]
        assert sum(rows) == ref["rows"] == ref["virtual_tokens"], (cfg, rows)
        assert max(rows) <= -(-ref["virtual_tokens"] // cp) + 5 * cfg[1], (cfg, rows)
