"""Context parallelism building blocks without process groups: token split / restore, the batch
layout and its gather specs, the sharded-KV slot mapping, and exact LSE merging of attention."""

from __future__ import annotations

import itertools

import pytest
import torch

from sglang.srt.entrypoints.cli import check_server_args
from sglang.srt.layers.attention.ops import attention_with_lse, causal_attention_lse, merge_state, sdpa_lse
from sglang.srt.layers.context_parallel import (
    FRESH,
    PREFIX,
    REPLICATED,
    CPLayout,
    restore_order,
    split_offsets,
    zigzag_segment_sizes,
)
from sglang.srt.mem_cache.cp_slots import CPSlotMapping, physical_kv_state, plan_virtual_pool
from sglang.srt.server_args import ServerArgs
from sglang.test.tiny_models import TINY_LLAMA_DIR

STRATEGIES = ("zigzag", "round-robin")


# ---------------------------------------------------------------------------- token split
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_split_restore_round_trip(strategy, cp):
    for n in list(range(0, 40)) + [97, 1000, 1023]:
        offs = split_offsets(n, cp, strategy)
        assert len(offs) == cp
        allo = torch.cat(offs)
        assert sorted(allo.tolist()) == list(range(n)), (n, cp)  # a partition of the request
        for o in offs:  # each rank's tokens ascend (local rows keep position order)
            assert torch.all(o[1:] > o[:-1])
        x = torch.randn(n, 3)
        shards = [x[o] for o in offs]
        assert torch.equal(restore_order(shards, n, strategy), x)
        sizes = [int(o.numel()) for o in offs]
        assert max(sizes) - min(sizes) <= (2 if strategy == "zigzag" else 1)


def test_zigzag_takes_head_and_tail_segments():
    sizes = zigzag_segment_sizes(19, 2)
    assert sizes == [5, 5, 5, 4]  # 19 = 4*4 + 3: the first 3 segments get one more token
    offs = split_offsets(19, 2, "zigzag")
    assert offs[0].tolist() == list(range(0, 5)) + list(range(15, 19))  # segments 0 and 3
    assert offs[1].tolist() == list(range(5, 15))  # segments 1 and 2
    # causal work (sum of query positions + 1) is balanced
    n = 4096
    work = [int((o + 1).sum()) for o in split_offsets(n, 4, "zigzag")]
    assert max(work) / min(work) < 1.01


def test_round_robin_is_token_mod_cp():
    offs = split_offsets(10, 3, "round-robin")
    assert [o.tolist() for o in offs] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    with pytest.raises(ValueError):
        split_offsets(4, 2, "interleave")


# ---------------------------------------------------------------------------- batch layout
EXT = [7, 1, 12, 3, 1, 2]
PRE = [0, 9, 0, 5, 4, 0]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("cp", [2, 3, 4])
def test_layout_partitions_split_tokens_and_replicates_decodes(strategy, cp):
    layouts = [CPLayout.build(EXT, PRE, cp, r, strategy) for r in range(cp)]
    n = sum(EXT)
    assert layouts[0].kinds == [FRESH, REPLICATED, FRESH, PREFIX, REPLICATED, FRESH]
    repl = [i for i, k in enumerate(layouts[0].kinds) if k == REPLICATED]
    repl_tokens = {layouts[0].starts[i] for i in repl}
    seen: list[int] = []
    for lay in layouts:
        idx = lay.local_idx.tolist()
        assert idx == sorted(idx)  # a subsequence of the flat token order
        assert repl_tokens <= set(idx)
        seen += [g for g in idx if g not in repl_tokens]
        assert sum(lay.local_counts) == lay.num_local
        for i in range(len(EXT)):  # a request's local rows are contiguous
            rows = lay.local_idx[lay.local_starts[i] : lay.local_starts[i] + lay.local_counts[i]]
            assert torch.equal(rows, lay.starts[i] + lay.local_offsets[i])
    assert sorted(seen) == sorted(set(range(n)) - repl_tokens)  # every split token on one rank


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("cp", [2, 4])
def test_gather_specs_restore_original_order(strategy, cp):
    """Simulate the all-gather: each rank contributes its spec rows; placing them at
    `global_idx` must reproduce the global tensor for any requested token subset."""
    layouts = [CPLayout.build(EXT, PRE, cp, r, strategy) for r in range(cp)]
    n = sum(EXT)
    x = torch.randn(n, 4)
    for want in (torch.arange(n), layouts[0].last_token_idx(), torch.tensor([3, 20, 7])):
        specs = [lay.gather_spec(want) for lay in layouts]
        assert all(s.sizes == specs[0].sizes for s in specs)
        assert all(torch.equal(s.global_idx, specs[0].global_idx) for s in specs)
        gathered = torch.cat([x[lay.local_idx][s.local_rows] for lay, s in zip(layouts, specs)])
        assert torch.equal(gathered, x[specs[0].global_idx])
        split_want = [g for g in want.tolist() if layouts[0].holder_rank[g] >= 0]
        assert sorted(specs[0].global_idx.tolist()) == sorted(split_want)
    # holder rows of replicated tokens point at this rank's local copy
    for lay in layouts:
        repl = torch.nonzero(lay.holder_rank < 0).flatten()
        assert torch.equal(lay.local_idx[lay.holder_row[repl]], repl)


def test_decode_only_layout_replicates_everything():
    for cp in (2, 4):
        lay = CPLayout.build([1, 1, 1], [4, 9, 2], cp, cp - 1)
        assert lay.kinds == [REPLICATED] * 3 and lay.is_trivial
        assert torch.equal(lay.local_idx, torch.arange(3)) and torch.all(lay.holder_rank == -1)
        assert torch.equal(lay.holder_row, torch.arange(3))
        assert lay.local_starts == [0, 1, 2] and lay.local_counts == [1, 1, 1]
        x = torch.randn(3, 2)
        assert torch.equal(lay.gather_rows(x, lay.last_token_idx()), x)


def test_layout_single_rank_is_identity():
    lay = CPLayout.build(EXT, PRE, 1, 0)
    assert torch.equal(lay.local_idx, torch.arange(sum(EXT)))
    assert lay.is_trivial
    x = torch.randn(sum(EXT), 2)
    assert torch.equal(lay.gather_all(x), x) and torch.equal(lay.scatter(x), x)


# ---------------------------------------------------------------------------- slot mapping
@pytest.mark.parametrize("page,cp,inter", [(1, 2, 1), (1, 4, 1), (4, 2, 1), (4, 2, 2), (4, 4, 4), (8, 3, 2)])
def test_slot_mapping_bijective_and_owner_rule(page, cp, inter):
    m = CPSlotMapping(page, cp, inter)
    vps = m.virtual_page_size
    num_pages = 5
    v = torch.arange(vps, (num_pages + 1) * vps)  # virtual page 0 is padding
    owner, local = m.to_physical(v)
    phys_size = m.physical_pool_size(num_pages * vps)
    assert phys_size == num_pages * page
    for r in range(cp):
        mine = owner == r
        assert int(mine.sum()) == num_pages * page  # every rank stores the same share
        slots = local[mine]
        assert slots.unique().numel() == slots.numel()  # injective on the owned set
        assert (
            int(slots.min()) >= page and int(slots.max()) < phys_size + page
        )  # inside the pool, off padding
        assert torch.equal(m.to_virtual(r, slots), v[mine])  # inverse
    # positions of a request starting at a virtual page: owner = (p // interleave) % cp
    start = 3 * vps
    pos = torch.arange(2 * vps + 5)
    assert torch.equal(m.owner(start + pos), (pos // inter) % cp)
    assert torch.equal(m.position_owner(pos), (pos // inter) % cp)
    for seq in range(0, 3 * vps + 2):
        counts = [int((m.position_owner(torch.arange(seq)) == r).sum()) for r in range(cp)]
        assert counts == [m.local_token_count(seq, r) for r in range(cp)]
        # a request's per-rank usage: owned tokens and reserved physical slots both within the bound
        bound = -(-seq // cp) + page
        assert max(counts) <= bound and m.reserved_physical_slots(seq) <= bound


@pytest.mark.parametrize("page,cp,inter", [(64, 2, 1), (16, 4, 4), (32, 8, 2), (1, 16, 1)])
def test_slot_mapping_shift_path_equals_the_division_formula(page, cp, inter):
    """Powers of two take shifts and masks; the result is the seed's division formula."""
    m = CPSlotMapping(page, cp, inter)
    v = torch.randint(0, 1 << 40, (4096,))
    vps = page * cp
    offset = v % vps
    lb = offset // inter
    assert torch.equal(m.owner(v), lb % cp)
    assert torch.equal(m.local_slot(v), (v // vps) * page + (lb // cp) * inter + offset % inter)
    assert torch.equal(m.position_owner(v), (v // inter) % cp)


def test_slot_mapping_matches_seed_formula_example():
    # block_size 4, cp 2, interleave 2: virtual block of 8 = [r0 r0 r1 r1 r0 r0 r1 r1]
    m = CPSlotMapping(4, 2, 2)
    v = torch.arange(8, 16)  # virtual block 1
    owner, local = m.to_physical(v)
    assert owner.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert local.tolist() == [4, 5, 4, 5, 6, 7, 6, 7]
    with pytest.raises(ValueError):
        CPSlotMapping(4, 2, 3)  # interleave must divide the page size


def test_virtual_pool_plan_and_usage_state():
    m = CPSlotMapping(2, 4)  # virtual page 8
    assert plan_virtual_pool(1000, m, per_rank=False) == (1000 // 8 * 8, 1000 // 8 * 2)
    virtual, physical = plan_virtual_pool(1000, m, per_rank=True)  # capacity grows with cp
    assert virtual == 4000 and physical == 1000
    with pytest.raises(ValueError, match="too small"):
        plan_virtual_pool(15, m, per_rank=False)
    state = physical_kv_state(m, 4000, 4000 - 48)
    assert state == {"cp_size": 4, "kv_physical_tokens_per_rank": 1000, "kv_physical_used_per_rank": 12}


# ---------------------------------------------------------------------------- LSE merge
def test_merge_of_partials_equals_full_softmax():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 6, 16, generator=g)
    k = torch.randn(1, 2, 40, 16, generator=g)
    v = torch.randn(1, 2, 40, 16, generator=g)
    full, full_lse = attention_with_lse(q, k, v, 0.25)
    ref = torch.softmax((q @ k.repeat_interleave(2, 1).transpose(-1, -2)) * 0.25, -1) @ v.repeat_interleave(
        2, 1
    )
    torch.testing.assert_close(full, ref, atol=1e-6, rtol=1e-5)
    owner = torch.randint(0, 3, (40,), generator=g)
    owner[0] = 3  # a shard of one key, and one empty shard below
    outs, lses = [], []
    for r in range(5):
        sel = torch.nonzero(owner == r).flatten()
        o, l = attention_with_lse(q, k[:, :, sel], v[:, :, sel], 0.25)
        outs.append(o)
        lses.append(l)
    assert torch.isinf(lses[4]).all()  # the empty shard drops out
    merged, lse = merge_state(outs, lses)
    torch.testing.assert_close(merged, full, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse, full_lse, atol=1e-6, rtol=1e-5)


def test_sdpa_lse_matches_math_with_masks_and_empty_rows():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 5, 8, generator=g)
    k = torch.randn(2, 2, 9, 8, generator=g)
    v = torch.randn(2, 2, 9, 8, generator=g)
    mask = torch.rand(2, 1, 5, 9, generator=g) > 0.5
    mask[0, 0, 2] = False  # a query that sees nothing
    for kwargs in ({}, {"attn_mask": mask}, {"is_causal": True}):
        o, l = sdpa_lse(q, k, v, 0.3, **kwargs)
        o_ref, l_ref = attention_with_lse(q, k, v, 0.3, **kwargs)
        torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(l, l_ref, atol=1e-5, rtol=1e-5)
    o, l = sdpa_lse(q, k[:, :, :0], v[:, :, :0], 0.3)
    assert torch.all(o == 0) and torch.isinf(l).all()


@pytest.mark.parametrize("block", [3, 1024])
def test_causal_attention_lse_any_positions(block):
    g = torch.Generator().manual_seed(2)
    n = 50
    k = torch.randn(n, 2, 8, generator=g)
    v = torch.randn(n, 2, 8, generator=g)
    q_all = torch.randn(n, 4, 8, generator=g)
    k_sets = {"all": torch.arange(n), "shard": torch.arange(1, n, 3), "late": torch.arange(30, n)}
    q_sets = {
        "all": torch.arange(n),
        "zigzag": split_offsets(n, 2, "zigzag")[1],
        "rr": split_offsets(n, 3, "round-robin")[2],
        "tail": torch.arange(40, n),
    }
    for (kn, kp), (qn, qp) in itertools.product(k_sets.items(), q_sets.items()):
        out, lse = causal_attention_lse(q_all[qp], qp, k[kp], v[kp], kp, 0.35, block=block)
        mask = kp.unsqueeze(0) <= qp.unsqueeze(1)  # [Lq, Lk]
        o_ref, l_ref = attention_with_lse(
            q_all[qp].transpose(0, 1), k[kp].transpose(0, 1), v[kp].transpose(0, 1), 0.35, attn_mask=mask
        )
        torch.testing.assert_close(out, o_ref.transpose(0, 1), atol=1e-5, rtol=1e-5, msg=f"{kn}/{qn}")
        torch.testing.assert_close(lse, l_ref.transpose(0, 1), atol=1e-5, rtol=1e-5, msg=f"{kn}/{qn}")


# ---------------------------------------------------------------------------- flags
def test_cp_server_args():
    args = ServerArgs(model_path=TINY_LLAMA_DIR, cp_size=2, page_size=4, cp_kv_cache_interleave_size=2)
    check_server_args(args)  # --cp-size alone: tp defaults to dp · cp
    from sglang.srt.distributed.parallel_layout import ParallelLayout

    layout = ParallelLayout.from_server_args(args)
    assert (layout.world_size, layout.attn_cp, layout.attn_tp) == (2, 2, 1)
    with pytest.raises(ValueError, match="interleave-size"):
        ServerArgs(
            model_path=TINY_LLAMA_DIR, cp_size=2, page_size=4, cp_kv_cache_interleave_size=3
        ).validate()
    # CP inside each attention-DP replica composes (test_dp_attention_engine.py runs it)
    args = ServerArgs(model_path=TINY_LLAMA_DIR, cp_size=2, tp_size=4, dp_size=2, enable_dp_attention=True)
    check_server_args(args)
    assert ParallelLayout.from_server_args(args).attn_tp == 1


def test_attention_backend_flag_validation():
    """Unknown names are refused by name; under CP the backend must support context parallelism."""
    with pytest.raises(ValueError, match="--attention-backend must be one of .*torch_native.*'nope'"):
        check_server_args(ServerArgs(model_path=TINY_LLAMA_DIR, attention_backend="nope"))
    for name in (None, "cpu", "intel_amx", "torch_native", "torch_native_mla"):
        check_server_args(ServerArgs(model_path=TINY_LLAMA_DIR, cp_size=2, attention_backend=name))
    assert ServerArgs(model_path=TINY_LLAMA_DIR).resolved_attention_backend == "cpu"
    assert ServerArgs(
        model_path=TINY_LLAMA_DIR, attention_backend="torch_native"
    ).resolved_attention_backend == ("torch_native")
    from sglang.srt.layers.attention import registry
    from sglang.srt.layers.attention.torch_native import TorchNativeAttnBackend

    class NoCP(TorchNativeAttnBackend):
        name = "no_cp_test"
        supports_context_parallel = False

    registry.register_attention_backend("no_cp_test")(NoCP)
    try:
        check_server_args(ServerArgs(model_path=TINY_LLAMA_DIR, attention_backend="no_cp_test"))
        with pytest.raises(ValueError, match="supports context parallelism, got 'no_cp_test'"):
            check_server_args(
                ServerArgs(model_path=TINY_LLAMA_DIR, cp_size=2, attention_backend="no_cp_test")
            )
    finally:
        registry._REGISTERED.pop("no_cp_test")
