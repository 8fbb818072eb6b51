"""`--enable-cp-dense-tp` (embedding / LM head vocab-sharded over the CP group, layers/cp_dense_tp.py):
the layouts it accepts, the ones it refuses by name, and the groups the weights are sharded over."""

from __future__ import annotations

import pytest

from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.entrypoints.cli import check_server_args
from sglang.srt.server_args import ServerArgs

BASE = dict(model_path="x", load_format="dummy")


def test_flag_accepted_at_tp_equal_cp():
    args = ServerArgs(**BASE, cp_size=2, enable_cp_dense_tp=True)
    check_server_args(args)
    layout = ParallelLayout.from_server_args(args)
    assert layout.cp_dense_tp and (layout.tp, layout.attn_cp, layout.attn_tp) == (2, 2, 1)
    assert not ParallelLayout.from_server_args(ServerArgs(**BASE, cp_size=2)).cp_dense_tp


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),  # cp 1
        dict(cp_size=2, tp_size=4),  # attention TP 2
        dict(cp_size=2, tp_size=4, dp_size=2, enable_dp_attention=True),
    ],
)
def test_flag_refused_by_name(kwargs):
    with pytest.raises(
        ValueError, match="--enable-cp-dense-tp .*needs --cp-size > 1, --tp-size == --cp-size"
    ):
        check_server_args(ServerArgs(**BASE, enable_cp_dense_tp=True, **kwargs))


def test_shard_linear_combination_refused():
    with pytest.raises(ValueError, match="--enable-shard-linear and --enable-cp-dense-tp"):
        check_server_args(ServerArgs(**BASE, cp_size=2, enable_cp_dense_tp=True, enable_shard_linear=True))


def test_weight_groups_follow_the_flag():
    """Off: embedding / LM head over attn_tp (size 1, replicated across cp); on: over the cp ranks."""
    from sglang.srt.distributed.parallel_state import ParallelGroups
    from sglang.srt.layers.communicator import embedding_tp_group, lm_head_tp_group

    class _Stub:  # only the sizes matter: the functions pick a coordinator of `groups`
        def __init__(self, size):
            self.size = size

    for flag, expected in ((False, 1), (True, 2)):
        layout = ParallelLayout(tp=2, attn_cp=2, cp_dense_tp=flag)
        groups = ParallelGroups(
            layout=layout,
            world_rank=0,
            tp=_Stub(2),
            pp=_Stub(1),
            attn_cp=_Stub(2),
            attn_tp=_Stub(1),
            moe_ep=_Stub(1),
            attn_dp=_Stub(1),
            moe_tp=_Stub(2),
            world=_Stub(2),
            replica=_Stub(2),
            local=_Stub(1),
        )
        assert embedding_tp_group(groups).size == expected
        for tied in (False, True):
            assert lm_head_tp_group(groups, tied).size == expected
