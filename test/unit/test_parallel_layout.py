"""ParallelLayout rank maths, exhaustively over every valid layout of up to 16 ranks, and its errors."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from sglang.srt.distributed.parallel_layout import AXES, ParallelLayout, resolve_tp_size
from sglang.srt.distributed.parallel_state import ParallelGroups


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def all_layouts(max_world: int = 16) -> list[ParallelLayout]:
    out = []
    for world in range(1, max_world + 1):
        for pp in _divisors(world):
            tp = world // pp
            for dp, cp, ep in itertools.product(_divisors(tp), _divisors(tp), _divisors(tp)):
                if tp % (dp * cp) == 0:
                    out.append(ParallelLayout(pp=pp, tp=tp, attn_dp=dp, attn_cp=cp, moe_ep=ep))
    return out


LAYOUTS = all_layouts()


def test_enumeration_is_big_and_includes_corner_cases():
    assert len(LAYOUTS) > 500
    assert ParallelLayout(pp=2, tp=8, attn_dp=2, attn_cp=2, moe_ep=4) in LAYOUTS
    assert ParallelLayout(pp=16) in LAYOUTS and ParallelLayout(tp=16, attn_cp=16) in LAYOUTS


def test_every_axis_partitions_the_world():
    for lay in LAYOUTS:
        world = set(range(lay.world_size))
        for axis in AXES:
            groups = lay.all_groups(axis)
            size = lay.size(axis)
            assert len(groups) * size == lay.world_size, (lay, axis)
            flat = [r for g in groups for r in g]
            assert len(flat) == len(set(flat)) and set(flat) == world, (lay, axis)
            for g in groups:
                assert len(g) == size
                # ordered by the axis coordinate, and every member agrees on the group
                assert [lay.axis_rank(axis, r) for r in g] == list(range(size)), (lay, axis, g)
                for r in g:
                    assert lay.ranks_of(axis, r) == g
                    # members differ ONLY in this axis' coordinate (within its view)
                    c0, c = lay.coords(g[0]), lay.coords(r)
                    same = {
                        "tp": ("pp",),
                        "pp": ("tp",),
                        "attn_dp": ("pp", "attn_cp", "attn_tp"),
                        "attn_cp": ("pp", "attn_dp", "attn_tp"),
                        "attn_tp": ("pp", "attn_dp", "attn_cp"),
                        "moe_ep": ("pp", "moe_tp"),
                        "moe_tp": ("pp", "moe_ep"),
                    }[axis]
                    assert all(c.axis(a) == c0.axis(a) for a in same), (lay, axis, r)


def test_coordinates_round_trip_and_fastest_axes():
    for lay in LAYOUTS:
        seen = set()
        for r in range(lay.world_size):
            c = lay.coords(r)
            assert lay.world_rank_of(c.pp, c.tp) == r == c.world_rank
            assert lay.tp_rank_of_attn(c.attn_dp, c.attn_cp, c.attn_tp) == c.tp
            assert lay.tp_rank_of_moe(c.moe_ep, c.moe_tp) == c.tp
            assert (
                0 <= c.attn_tp < lay.attn_tp and 0 <= c.attn_cp < lay.attn_cp and 0 <= c.attn_dp < lay.attn_dp
            )
            assert 0 <= c.moe_tp < lay.moe_tp and 0 <= c.moe_ep < lay.moe_ep and 0 <= c.pp < lay.pp
            seen.add((c.pp, c.attn_dp, c.attn_cp, c.attn_tp))
            # attn_tp / moe_tp are fastest: neighbouring tp ranks differ there first
            assert c.attn_tp == c.tp % lay.attn_tp and c.moe_tp == c.tp % lay.moe_tp
            assert c.attn_cp == (c.tp // lay.attn_tp) % lay.attn_cp
        assert len(seen) == lay.world_size


def test_concrete_groups():
    lay = ParallelLayout(pp=2, tp=4, attn_dp=1, attn_cp=2, moe_ep=2)
    assert lay.all_groups("tp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert lay.all_groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert lay.all_groups("attn_tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lay.all_groups("attn_cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert lay.all_groups("attn_dp") == [[r] for r in range(8)]
    assert lay.all_groups("moe_ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert lay.ranks_of("moe_tp", 7) == [6, 7]
    c = lay.coords(6)
    assert (c.pp, c.tp, c.attn_cp, c.attn_tp, c.moe_ep, c.moe_tp) == (1, 2, 1, 0, 1, 0)


def test_pp_neighbors_ring():
    for lay in LAYOUTS:
        for r in range(lay.world_size):
            prev, nxt = lay.pp_neighbors(r)
            c, cp_, cn = lay.coords(r), lay.coords(prev), lay.coords(nxt)
            assert cp_.tp == c.tp == cn.tp
            assert cn.pp == (c.pp + 1) % lay.pp and cp_.pp == (c.pp - 1) % lay.pp
            assert lay.pp_neighbors(nxt)[0] == r
    assert ParallelLayout(pp=3, tp=2).pp_neighbors(1) == (5, 3)
    assert ParallelLayout(pp=1, tp=2).pp_neighbors(1) == (1, 1)


def test_entry_rank():
    lay = ParallelLayout(pp=2, tp=2)
    assert [lay.is_entry_rank(r) for r in range(4)] == [True, False, False, False]
    assert [lay.is_replica_entry(r) for r in range(4)] == [True, False, False, False]  # one replica


def test_replicas():
    """An attention-DP replica is the attn_cp × attn_tp block of one attn_dp coordinate in one stage."""
    lay = ParallelLayout(pp=2, tp=8, attn_dp=2, attn_cp=2)  # attn_tp 2
    assert lay.replica_ranks(5) == [4, 5, 6, 7] and lay.replica_ranks(9) == [8, 9, 10, 11]
    assert lay.all_replica_groups() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert [r for r in range(16) if lay.is_replica_entry(r)] == [0, 4]  # stage 0 only
    for r in range(16):
        c = lay.coords(r)
        assert all(
            lay.coords(x).attn_dp == c.attn_dp and lay.coords(x).pp == c.pp for x in lay.replica_ranks(r)
        )
    one = ParallelLayout(tp=4, attn_cp=2)
    assert one.all_replica_groups() == [[0, 1, 2, 3]] == [one.ranks_of("tp", 0)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tp=4, attn_dp=3), r"tp_size \(4\) must be divisible by dp_size × cp_size \(3 × 1 = 3\)"),
        (
            dict(tp=4, attn_dp=2, attn_cp=4),
            r"tp_size \(4\) must be divisible by dp_size × cp_size \(2 × 4 = 8\)",
        ),
        (dict(tp=6, moe_ep=4), r"tp_size \(6\) must be divisible by ep_size \(4\)"),
        (dict(pp=0), r"pp_size must be a positive integer, got 0"),
        (dict(tp=-2), r"tp_size must be a positive integer, got -2"),
        (dict(attn_cp=1.5), r"cp_size must be a positive integer, got 1.5"),
    ],
)
def test_validate_messages(kwargs, message):
    lay = ParallelLayout(**kwargs)
    with pytest.raises(ValueError, match=message) as info:
        lay.validate()
    text = str(info.value)
    assert "\n" not in text and text.count(".") <= 2  # one readable sentence
    with pytest.raises(ValueError):
        lay.coords(0)  # maths on a bad layout refuses too


def test_bad_queries():
    lay = ParallelLayout(pp=2, tp=2)
    with pytest.raises(ValueError, match="out of range"):
        lay.coords(4)
    with pytest.raises(ValueError, match="unknown parallel axis 'dp'"):
        lay.ranks_of("dp", 0)


def _args(**kw):
    base = dict(tp_size=1, pp_size=1, dp_size=1, cp_size=1, ep_size=1, enable_dp_attention=False)
    base.update(kw)
    return SimpleNamespace(**base)


def test_from_server_args_and_tp_default():
    assert ParallelLayout.from_server_args(_args()) == ParallelLayout()
    assert ParallelLayout.from_server_args(_args(tp_size=4, pp_size=2, ep_size=2)) == ParallelLayout(
        pp=2, tp=4, moe_ep=2
    )
    # dp counts for attention only with DP attention
    assert ParallelLayout.from_server_args(_args(tp_size=4, dp_size=2)).attn_dp == 1
    lay = ParallelLayout.from_server_args(_args(tp_size=4, dp_size=2, enable_dp_attention=True))
    assert (lay.attn_dp, lay.attn_tp) == (2, 2)
    # --cp-size alone: tp defaults to dp * cp
    assert ParallelLayout.from_server_args(_args(cp_size=4)) == ParallelLayout(tp=4, attn_cp=4)
    lay = ParallelLayout.from_server_args(_args(cp_size=2, dp_size=2, enable_dp_attention=True))
    assert (lay.tp, lay.attn_tp) == (4, 1)
    with pytest.raises(
        ValueError, match=r"tp_size \(6\) must be divisible by dp_size × cp_size \(1 × 4 = 4\)"
    ):
        ParallelLayout.from_server_args(_args(tp_size=6, cp_size=4))
    assert resolve_tp_size(None, 2, 3) == 6 and resolve_tp_size(8, 2, 3) == 8


def test_single_groups_are_noops():
    import torch

    g = ParallelGroups.single()
    assert g.is_entry_rank and g.layout.world_size == 1 and g.pp_next_rank == 0 == g.pp_prev_rank
    for axis in AXES + ("world",):
        c = g.axis(axis)
        assert (c.size, c.rank, c.is_first, c.is_last) == (1, 0, True, True)
    x = torch.arange(6.0).view(2, 3)
    assert g.tp.all_reduce(x) is x and g.tp.all_gather(x, dim=0) is x and g.tp.broadcast(x) is x
    assert g.tp.all_gather_uneven(x)[0] is x and g.tp.reduce_scatter(x) is x
    assert g.tp.broadcast_object({"a": 1}) == {"a": 1} and g.tp.all_gather_object(3) == [3]
    g.tp.barrier()
