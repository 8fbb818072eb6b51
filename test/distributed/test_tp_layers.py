"""Tensor-parallel layers on 2, 3 and 4 gloo ranks vs an unsharded reference built from the full weights.

Every rank draws the same full weights (same seed), loads them through the layers' `weight_loader`s
and checks its sharded outputs, and the all-reduced / all-gathered results, against plain torch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from sglang.srt.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding

ATOL = 1e-5
HIDDEN, HEAD_DIM = 12, 4
# (heads, kv heads): on 3 ranks 9/3 splits evenly; 4/2 on 4 ranks replicates each KV head twice;
# 8/1 replicates the single KV head everywhere; the others fail on some tp sizes with a ValueError.
HEAD_CONFIGS = [(9, 3), (4, 2), (8, 1), (6, 6), (12, 4), (6, 3)]


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-5)


def _qkv_expected_error(heads: int, kv: int, tp: int) -> str | None:
    if heads % tp:
        return "number of attention heads"
    if kv >= tp and kv % tp:
        return "number of KV heads"
    if kv < tp and tp % kv:
        return "must be a multiple of the number of KV heads"
    return None


def _check_qkv_and_o(tp, heads: int, kv: int, x: torch.Tensor) -> str:
    gen = torch.Generator().manual_seed(heads * 100 + kv)
    wq, wk, wv = (torch.randn(n * HEAD_DIM, HIDDEN, generator=gen) for n in (heads, kv, kv))
    bq, bk, bv = (torch.randn(n * HEAD_DIM, generator=gen) for n in (heads, kv, kv))
    wo = torch.randn(HIDDEN, heads * HEAD_DIM, generator=gen)
    err = _qkv_expected_error(heads, kv, tp.size)
    if err is not None:
        with pytest.raises(ValueError, match=err):
            QKVParallelLinear(HIDDEN, HEAD_DIM, heads, kv, bias=True, tp=tp)
        return "error"
    layer = QKVParallelLinear(HIDDEN, HEAD_DIM, heads, kv, bias=True, tp=tp)
    if tp.rank % 2:  # odd ranks load a fused qkv checkpoint tensor, even ranks q/k/v separately
        layer.weight.weight_loader(layer.weight, torch.cat([wq, wk, wv]))
        layer.bias.weight_loader(layer.bias, torch.cat([bq, bk, bv]))
    else:
        for sid, w, b in (("q", wq, bq), ("k", wk, bk), ("v", wv, bv)):
            layer.weight.weight_loader(layer.weight, w, sid)
            layer.bias.weight_loader(layer.bias, b, sid)
    out = layer(x)
    q, k, v = out.split([layer.q_size, layer.kv_size, layer.kv_size], dim=-1)
    full_q, full_k, full_v = x @ wq.T + bq, x @ wk.T + bk, x @ wv.T + bv
    # q heads: contiguous share; all-gathered they are the full q
    _close(tp.all_gather(q, dim=-1), full_q)
    # kv heads: this rank's share, or the replicated head it serves
    kv_rank = tp.rank // layer.num_kv_head_replicas
    kv_cols = slice(kv_rank * layer.kv_size, (kv_rank + 1) * layer.kv_size)
    _close(k, full_k[:, kv_cols])
    _close(v, full_v[:, kv_cols])
    # GQA grouping survives sharding: local q head h uses local KV head h // (local q per kv), which
    # must be the global KV head of its global q head
    local_group = layer.num_heads // layer.num_kv_heads
    for h in range(layer.num_heads):
        global_q = tp.rank * layer.num_heads + h
        assert kv_rank * layer.num_kv_heads + h // local_group == global_q // (heads // kv)
    # o_proj (row parallel over the same heads) restores the full output
    o = RowParallelLinear(heads * HEAD_DIM, HIDDEN, bias=False, tp=tp)
    o.weight.weight_loader(o.weight, wo)
    _close(o(q), full_q @ wo.T)
    return "ok" if layer.num_kv_head_replicas == 1 else f"replicated x{layer.num_kv_head_replicas}"


def _check_mlp(tp, x: torch.Tensor) -> None:
    inter = 6 * tp.size
    gen = torch.Generator().manual_seed(7)
    gate, up, down = (
        torch.randn(inter, HIDDEN, generator=gen),
        torch.randn(inter, HIDDEN, generator=gen),
        torch.randn(HIDDEN, inter, generator=gen),
    )
    bg, bu, bd = (
        torch.randn(inter, generator=gen),
        torch.randn(inter, generator=gen),
        torch.randn(HIDDEN, generator=gen),
    )
    gu = MergedColumnParallelLinear(HIDDEN, [inter, inter], bias=True, tp=tp)
    gu.weight.weight_loader(gu.weight, gate, 0)
    gu.weight.weight_loader(gu.weight, up, 1)
    gu.bias.weight_loader(gu.bias, torch.cat([bg, bu]))  # fused, no shard id
    row = RowParallelLinear(inter, HIDDEN, bias=True, tp=tp)
    row.weight.weight_loader(row.weight, down)
    row.bias.weight_loader(row.bias, bd)
    act = SiluAndMul()(gu(x))
    full_act = F.silu(x @ gate.T + bg) * (x @ up.T + bu)
    n = inter // tp.size
    _close(act, full_act[:, tp.rank * n : (tp.rank + 1) * n])
    _close(row(act), full_act @ down.T + bd)

    # row without the reduction: partial sums, the bias added by tp rank 0 only, so the caller's sum
    # (e.g. the DP partial gather) is the full output
    partial = RowParallelLinear(inter, HIDDEN, bias=True, tp=tp, reduce_results=False)
    partial.weight.weight_loader(partial.weight, down)
    partial.bias.weight_loader(partial.bias, bd)
    mine = partial(act)
    _close(mine, act @ down[:, tp.rank * n : (tp.rank + 1) * n].T + (bd if tp.rank == 0 else 0))
    _close(tp.all_reduce(mine), full_act @ down.T + bd)


def _check_column(tp, x: torch.Tensor) -> None:
    out_features = 5 * tp.size
    gen = torch.Generator().manual_seed(11)
    w, b = torch.randn(out_features, HIDDEN, generator=gen), torch.randn(out_features, generator=gen)
    for gather in (False, True):
        col = ColumnParallelLinear(HIDDEN, out_features, bias=True, tp=tp, gather_output=gather)
        col.weight.weight_loader(col.weight, w)
        col.bias.weight_loader(col.bias, b)
        full = x @ w.T + b
        _close(col(x), full if gather else full[:, tp.rank * 5 : (tp.rank + 1) * 5])
    with pytest.raises(ValueError, match=r"output size \(7\) must be divisible"):
        ColumnParallelLinear(HIDDEN, 7, tp=tp)
    with pytest.raises(ValueError, match=r"input size \(7\) must be divisible"):
        RowParallelLinear(7, HIDDEN, tp=tp)


def _check_vocab(tp) -> None:
    vocab = 4 * tp.size + 1  # never divisible by the tp size
    gen = torch.Generator().manual_seed(13)
    w, b = torch.randn(vocab, HIDDEN, generator=gen), torch.randn(vocab, generator=gen)
    ids = torch.tensor([0, vocab - 1, 5, 3, vocab - 2, 1, 0])
    emb = VocabParallelEmbedding(vocab, HIDDEN, tp=tp)
    emb.weight.weight_loader(emb.weight, w)
    _close(emb(ids), w[ids])
    assert emb.num_embeddings_padded % tp.size == 0 and emb.num_embeddings_padded >= vocab

    h = torch.randn(4, HIDDEN, generator=gen)
    head = ParallelLMHead(vocab, HIDDEN, tp=tp, bias=True)
    head.weight.weight_loader(head.weight, w)
    head.bias.weight_loader(head.bias, b)
    logits = head.compute_logits(h)
    assert logits.shape == (4, vocab)
    _close(logits, h @ w.T + b)
    tied = ParallelLMHead(vocab, HIDDEN, tp=tp)
    tied.tie_to(emb)
    _close(tied.compute_logits(h), h @ w.T)


def _body(rank: int, world_size: int) -> dict:
    groups = ParallelGroups.build(ParallelLayout(tp=world_size), rank)
    tp = groups.tp
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(3))
    qkv = {f"{h}/{kv}": _check_qkv_and_o(tp, h, kv, x) for h, kv in HEAD_CONFIGS}
    _check_mlp(tp, x)
    _check_column(tp, x)
    _check_vocab(tp)
    return qkv


@pytest.mark.parametrize("tp_size", [2, 3, 4])
def test_tp_layers_match_unsharded_reference(tp_size):
    results = run_ranks(_body, tp_size)
    qkv = results[0]
    assert all(r == qkv for r in results)
    expected = {
        2: {"9/3": "error", "4/2": "ok", "8/1": "replicated x2", "6/6": "ok", "12/4": "ok", "6/3": "error"},
        3: {"9/3": "ok", "4/2": "error", "8/1": "error", "6/6": "ok", "12/4": "error", "6/3": "ok"},
        4: {
            "9/3": "error",
            "4/2": "replicated x2",
            "8/1": "replicated x4",
            "6/6": "error",
            "12/4": "ok",
            "6/3": "error",
        },
    }[tp_size]
    assert qkv == expected
