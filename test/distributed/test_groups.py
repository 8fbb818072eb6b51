"""ParallelGroups on 4 spawned gloo ranks: every collective of every axis, and point-to-point messages."""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import AXES, ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups


def _check_collectives(groups: ParallelGroups, axis: str) -> None:
    g = groups.axis(axis)
    me = groups.world_rank
    assert g.ranks[g.rank] == me == g.world_rank
    expected_ranks = list(range(4)) if axis == "world" else groups.layout.ranks_of(axis, me)
    assert g.ranks == expected_ranks, (axis, g.ranks)

    x = torch.full((2, 3), float(me + 1))
    assert g.all_reduce(x) is x
    assert torch.equal(x, torch.full((2, 3), float(sum(r + 1 for r in g.ranks))))
    m = torch.tensor([float(me)])
    assert g.all_reduce(m, op="max").item() == max(g.ranks)

    t = torch.arange(6.0).view(2, 3) + 100 * me
    parts = [torch.arange(6.0).view(2, 3) + 100 * r for r in g.ranks]
    assert torch.equal(g.all_gather(t, dim=-1), torch.cat(parts, dim=-1))
    assert torch.equal(g.all_gather(t, dim=0), torch.cat(parts, dim=0))
    assert torch.equal(g.all_gather(t.t(), dim=1), torch.cat([p.t() for p in parts], dim=1))  # non-contiguous
    assert all(torch.equal(a, b) for a, b in zip(g.all_gather_list(t), parts))
    assert g.all_gather(torch.tensor(float(me)), dim=0).tolist() == [float(r) for r in g.ranks]

    # uneven sizes along dim 0 (rank i of the group holds i + 1 rows; one may hold none)
    rows = g.rank + 1 if g.rank != 1 else 0
    mine = torch.full((rows, 2), float(me))
    got = g.all_gather_uneven(mine, dim=0)
    want_rows = [i + 1 if i != 1 else 0 for i in range(g.size)]
    assert [p.shape[0] for p in got] == want_rows
    assert all(torch.equal(p, torch.full((n, 2), float(r))) for p, n, r in zip(got, want_rows, g.ranks))
    got_known = g.all_gather_uneven(mine.t(), dim=1, sizes=want_rows)
    assert all(torch.equal(a, b.t()) for a, b in zip(got_known, got))

    # reduce_scatter: chunk g.rank of the sum
    full = torch.arange(g.size * 2 * 3, dtype=torch.float32).view(g.size * 2, 3)
    total = float(sum(r + 1 for r in g.ranks))
    rs = g.reduce_scatter(full * (me + 1), dim=0)
    assert torch.equal(rs, (full * total)[g.rank * 2 : g.rank * 2 + 2])
    rs1 = g.reduce_scatter((full * (me + 1)).t().contiguous(), dim=1)
    assert torch.equal(rs1, (full * total).t()[:, g.rank * 2 : g.rank * 2 + 2])

    src = g.size - 1
    b = torch.full((3,), float(me))
    assert torch.equal(g.broadcast(b, src=src), torch.full((3,), float(g.ranks[src])))
    obj = g.broadcast_object({"from": me, "axis": axis} if g.rank == src else None, src=src)
    assert obj == {"from": g.ranks[src], "axis": axis}
    assert g.all_gather_object(("r", me)) == [("r", r) for r in g.ranks]
    g.barrier()


def _check_ring(groups: ParallelGroups, axis: str) -> list:
    """Each rank sends objects / tensors to the next rank of the group ring and receives from the previous."""
    g = groups.axis(axis)
    me = groups.world_rank
    prev_world = g.ranks[g.prev_rank]
    pending = [g.isend_object({"n": i, "from": me, "blob": "x" * (1000 * i)}, g.next_rank) for i in range(3)]
    got = [g.recv_object(g.prev_rank) for _ in range(3)]
    for p in pending:
        p.wait()
    assert got == [{"n": i, "from": prev_world, "blob": "x" * (1000 * i)} for i in range(3)]

    tensors = {
        "hidden_states": torch.full((3, 4), float(me)),
        "residual": torch.arange(8, dtype=torch.bfloat16).view(2, 4),
        "empty": torch.empty(0, 4),
        "ids": torch.tensor([me, 7], dtype=torch.int64),
    }
    send = g.isend_tensor_dict(tensors, g.next_rank)
    recv = g.recv_tensor_dict(g.prev_rank)
    send.wait()
    assert list(recv) == list(tensors)
    assert torch.equal(recv["hidden_states"], torch.full((3, 4), float(prev_world)))
    assert recv["residual"].dtype == torch.bfloat16 and torch.equal(recv["residual"], tensors["residual"])
    assert recv["empty"].shape == (0, 4)
    assert recv["ids"].tolist() == [prev_world, 7]

    buf = torch.empty(5)
    work = g.irecv(buf, g.prev_rank)
    g.isend(torch.full((5,), float(me) + 0.5), g.next_rank).wait()
    work.wait()
    assert torch.equal(buf, torch.full((5,), float(prev_world) + 0.5))
    with pytest.raises(ValueError, match="itself"):
        g.send_object(1, g.rank)
    return [x["from"] for x in got]


def _body(rank: int, world_size: int, layout: ParallelLayout, ring_axis: str) -> dict:
    with pytest.raises(ValueError, match="layout needs 2"):
        ParallelGroups.build(ParallelLayout(tp=2), rank)
    groups = ParallelGroups.build(layout, rank, backend="gloo", device="cpu")
    assert groups.layout == layout and groups.coords.world_rank == rank
    for axis in ("world",) + AXES:
        _check_collectives(groups, axis)
    prev, nxt = layout.pp_neighbors(rank)
    assert (groups.pp_prev_rank, groups.pp_next_rank) == (prev, nxt)
    ring = _check_ring(groups, ring_axis)
    assert groups.replica.ranks == layout.replica_ranks(rank)
    assert int(groups.replica.all_reduce(torch.ones(1)).item()) == groups.replica.size
    return {
        "entry": groups.is_entry_rank,
        "replica_entry": groups.is_replica_entry,
        "dp_rank": groups.dp_rank,
        "ring_from": ring[0],
        "sizes": {a: groups.axis(a).size for a in AXES},
        "shared_tp_world": groups.tp.cpu_group is groups.world.cpu_group,
    }


def test_groups_pp2_tp2():
    layout = ParallelLayout(pp=2, tp=2)
    res = run_ranks(_body, 4, args=(layout, "pp"))
    assert [r["entry"] for r in res] == [True, False, False, False]
    assert [r["ring_from"] for r in res] == [2, 3, 0, 1]  # pp ring: stage 1 <-> stage 0, same tp rank
    assert res[0]["sizes"] == {
        "tp": 2,
        "pp": 2,
        "attn_dp": 1,
        "attn_cp": 1,
        "attn_tp": 2,
        "moe_ep": 1,
        "moe_tp": 2,
    }
    assert not res[0]["shared_tp_world"]


def test_groups_tp4_dp2():
    layout = ParallelLayout(tp=4, attn_dp=2)
    res = run_ranks(_body, 4, args=(layout, "attn_dp"))
    assert [r["replica_entry"] for r in res] == [True, False, True, False]
    assert [r["dp_rank"] for r in res] == [0, 0, 1, 1]
    assert [r["ring_from"] for r in res] == [2, 3, 0, 1]  # attn_dp group: same attn_tp rank, other replica


def test_groups_tp4_cp2():
    layout = ParallelLayout(tp=4, attn_cp=2, moe_ep=2)
    res = run_ranks(_body, 4, args=(layout, "tp"))
    assert [r["ring_from"] for r in res] == [3, 0, 1, 2]
    assert res[3]["sizes"] == {
        "tp": 4,
        "pp": 1,
        "attn_dp": 1,
        "attn_cp": 2,
        "attn_tp": 2,
        "moe_ep": 2,
        "moe_tp": 2,
    }
    assert res[0]["shared_tp_world"]  # same rank set -> the same process groups, created once
