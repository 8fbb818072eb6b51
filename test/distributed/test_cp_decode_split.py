"""CP decode without redundant work (`CPLayout.split_decodes`): each cp rank runs the dense layers,
MoE and LM head of its share of the decodes only; decode attention still covers every rank's KV
shard (queries gathered, partials sent to the holder and merged there).

Tiny Llama (MHA) and tiny DeepSeek-V3.2 (MLA + DSA, index_topk 8) on 2 gloo ranks vs the
single-rank model, float32, driven on hand-built batches: requests join in three waves beside the
running decodes (ragged prompt lengths), so the decode batches have 1 (< cp), 2 (= cp) and 5
(> cp) requests, and the joining steps mix prefills with decodes. Tokens identical to cp 1 and
logits within 1e-4, with split decodes and with the old replicated path; V3.2 also under
cp 2 x ep 2, where the MoE routes each rank's own tokens first and moves them by the EP
all-to-all, overlapped with the shared experts (`ep_all_to_all.moe_all_to_all`). Per-rank work from `CPStats`: with split decodes each rank ran exactly its
round-robin share of the decode tokens and of the LM-head rows, and merged each decode partial
once over all ranks (the old path: every rank every decode). The holder merge
(`exchange_to_holders` + merge) equals the all-gather merge on random partials with LSEs.
"""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers.attention.cp_merge import merge_partials
from sglang.srt.layers.context_parallel import REPLICATED, CPLayout, CPStats, build_cp_layout_for_batch
from sglang.test.cp_forward_helpers import CPForwardHarness, pp_stepper
from sglang.test.cp_moe_driver import load_model
from sglang.test.tiny_models import TINY_LLAMA_DIR, write_random_checkpoint
from sglang.test.tiny_moe_models import deepseek_v32_config, save_random_model

TOL = 1e-4
PROMPT_LENS = (5, 11, 17, 8, 23)
WAVES = ((1, 3), (1, 3), (3, 4))  # (requests joining, decode steps after the joining step)
LAYOUTS = {"cp2": dict(tp=2, attn_cp=2), "cp2-ep2": dict(tp=2, attn_cp=2, moe_ep=2)}
MIN_SPLIT = 12  # adaptive CP runs: prompts 5, 11 and 8 run whole on every rank, 17 and 23 split
# (model, layout, split decodes, min_split_tokens)
RUNS = [
    ("llama", "cp2", True, 0),
    ("llama", "cp2", False, 0),
    ("llama", "cp2", True, MIN_SPLIT),
    ("v32", "cp2", True, 0),
    ("v32", "cp2", False, 0),
    ("v32", "cp2", True, MIN_SPLIT),
    ("v32", "cp2-ep2", True, 0),
    ("v32", "cp2-ep2", True, MIN_SPLIT),
]


def _run_id(run) -> str:
    return f"{run[0]}-{run[1]}-{'split' if run[2] else 'replicated'}" + (f"-min{run[3]}" if run[3] else "")


class SplitHarness(CPForwardHarness):
    """A CP harness whose batches carry the layout of the chosen decode path, with counters."""

    def __init__(self, *args, split_decodes: bool = True, min_split: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.split_decodes, self.min_split = split_decodes, min_split
        self.stats = CPStats()

    def build_batch(self, items, return_all_logits: bool = False):
        fb = super().build_batch(items, return_all_logits)
        if fb.cp_layout is not None:
            build_cp_layout_for_batch(
                fb, self.group, self.strategy, self.mapping, self.split_decodes, self.stats, self.min_split
            )
        return fb


def generate(path: str, groups: ParallelGroups, split_decodes: bool = True, min_split: int = 0) -> dict:
    hf_config, model = load_model(path, groups)
    h = SplitHarness(
        hf_config,
        groups.attn_cp,
        "zigzag",
        max_total_tokens=1024,
        attn_tp_size=groups.attn_tp.size,
        split_decodes=split_decodes,
        min_split=min_split,
    )
    h.token_to_kv_pool = model.create_kv_pool(
        h.mapping.physical_pool_size(h.allocator.size), 1, torch.float32
    )
    step = pp_stepper(h, model, groups, [])
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, hf_config.vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    reqs, tokens, logits, decodes = [], [], [], []

    def run(items) -> None:
        out = step(items)
        logits.append(out.clone())
        decodes.append([len(toks) == 1 for _, toks in items])
        for row, t in enumerate(tokens):
            t.append(int(out[row].argmax()))

    for joining, steps in WAVES:
        items = [(r, [t[-1]]) for r, t in zip(reqs, tokens)]
        for p in prompts[len(reqs) : len(reqs) + joining]:
            reqs.append(h.new_request())
            tokens.append([])
            items.append((reqs[-1], p))
        run(items)
        for _ in range(steps):
            run([(r, [t[-1]]) for r, t in zip(reqs, tokens)])
    stats = h.stats
    a2a = [
        m.mlp.all_to_all for m in model.model.layers if getattr(getattr(m, "mlp", None), "all_to_all", None)
    ]
    return {
        "moe_a2a": (len(a2a), sum(d.overlapped for d in a2a)),
        "tokens": tokens,
        "logits": logits,
        "decodes": decodes,
        "stats": (stats.decode_rows, stats.logit_rows, stats.merged_rows),
        "unsplit": stats.unsplit_prefill_tokens,
        "layers": model.end_layer - model.start_layer,
    }


def _merge_check(group) -> bool:
    """The holder merge equals the all-gather merge, on random partials (some LSEs -inf)."""
    gen = torch.Generator().manual_seed(3 + group.rank)
    n, h, d = 7, 3, 5
    part_o = torch.randn(n, h, d, generator=gen)
    part_l = torch.randn(n, h, generator=gen) * 4
    part_l[torch.rand(n, h, generator=gen) < 0.3] = float("-inf")
    holders = torch.tensor([1, 0, 0, 1, 1, 0, 1])
    layout = CPLayout.build([1] * n, [4] * n, group.size, group.rank, group=group)
    layout.stats = CPStats()
    _, every = merge_partials(layout, part_o, part_l, None)
    mine, merged = merge_partials(layout, part_o, part_l, holders)
    assert torch.equal(mine, torch.nonzero(holders == group.rank).flatten())
    torch.testing.assert_close(merged, every[mine], atol=1e-6, rtol=0)
    assert layout.stats.merged_rows == n + int(mine.numel())
    return True


def _body(rank: int, world_size: int, paths: dict[str, str]) -> dict:
    out: dict = {}
    for model, layout, split, min_split in RUNS:
        groups = ParallelGroups.build(ParallelLayout(**LAYOUTS[layout]), rank)
        out[(model, layout, split, min_split)] = generate(paths[model], groups, split, min_split)
        if "merge" not in out:
            out["merge"] = _merge_check(groups.attn_cp)
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cp_decode_ckpt")
    v32 = str(root / "v32")
    save_random_model(deepseek_v32_config(index_topk=8), v32, seed=11)
    return {"llama": write_random_checkpoint(TINY_LLAMA_DIR, str(root / "llama"), seed=11), "v32": v32}


@pytest.fixture(scope="module")
def reference(checkpoints) -> dict:
    return {name: generate(path, ParallelGroups.single()) for name, path in checkpoints.items()}


@pytest.fixture(scope="module")
def results(checkpoints) -> list[dict]:
    return run_ranks(_body, 2, args=(checkpoints,), timeout=500)


def test_split_decode_layout_deals_decodes_round_robin():
    """Decodes only and mixed: decode j of the batch on rank j mod cp, every token on one rank."""
    for ext, pre in (([1] * 5, [3, 9, 4, 7, 2]), ([1, 6, 1, 1, 9, 1], [4, 0, 8, 2, 5, 3])):
        cp = 2
        lays = [CPLayout.build(ext, pre, cp, r, split_decodes=True) for r in range(cp)]
        starts = lays[0].starts
        dec = [starts[i] for i, k in enumerate(lays[0].kinds) if k == REPLICATED]
        for j, g in enumerate(dec):
            assert int(lays[0].holder_rank[g]) == j % cp
        held = torch.cat([lay.local_idx for lay in lays]).sort().values
        assert torch.equal(held, torch.arange(sum(ext)))
        for r, lay in enumerate(lays):
            assert not lay.is_trivial and lay.num_local_decodes() == len(dec[r::cp])
            assert torch.equal(lay.holder_rank[lay.local_idx], torch.full((lay.num_local,), r))
            assert torch.equal(lay.holder_row[lay.local_idx], torch.arange(lay.num_local))


@pytest.mark.slow  # spawns gloo ranks
def test_holder_merge_equals_all_gather_merge(results):
    assert all(res["merge"] for res in results)


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS, ids=_run_id)
def test_cp_decode_matches_single_rank(results, reference, run):
    ref = reference[run[0]]
    assert len({tuple(t) for t in ref["tokens"]}) == len(PROMPT_LENS)  # not degenerate
    for rank, res in enumerate(results):
        got = res[run]
        assert got["tokens"] == ref["tokens"], (run, rank)
        for i, (a, b) in enumerate(zip(got["logits"], ref["logits"])):
            torch.testing.assert_close(
                a, b, atol=TOL, rtol=0, msg=lambda m: f"{run} rank {rank} step {i}: {m}"
            )


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS, ids=_run_id)
def test_each_rank_runs_its_share_of_the_decodes(results, run):
    split, cp = run[2], 2
    steps = results[0][run]["decodes"]
    layers = results[0][run]["layers"]
    total_decodes = sum(sum(s) for s in steps)
    assert [len(s) for s in steps if all(s)] == [1] * 3 + [2] * 3 + [5] * 4  # < cp, = cp, > cp
    for rank, res in enumerate(results):
        decode_rows, logit_rows, merged_rows = res[run]["stats"]
        if not split:
            assert decode_rows == total_decodes and logit_rows == 0 and merged_rows == total_decodes * layers
            continue
        share = sum(len([d for d in s if d][rank::cp]) for s in steps)
        assert decode_rows == share, (rank, decode_rows, share)
        assert merged_rows == share * layers
    if split:  # an unsplit prompt's last token: its logits on every rank (no gather)
        logits = [res[run]["stats"][1] for res in results]
        unsplit = len([n for n in PROMPT_LENS if n < run[3]])
        assert sum(logits) == sum(len(s) for s in steps) + (cp - 1) * unsplit
        assert max(logits) < sum(len(s) for s in steps)


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS, ids=_run_id)
def test_short_prompts_run_whole_on_every_rank(results, run):
    """Adaptive CP (`min_split_tokens`): each prompt shorter than it ran whole on every rank (its
    tokens counted by every rank's `unsplit_prefill_tokens`); the others were split."""
    want = sum(n for n in PROMPT_LENS if n < run[3])
    assert run[3] == 0 or 0 < want < sum(PROMPT_LENS)  # both kinds joined the batches
    assert [res[run]["unsplit"] for res in results] == [want] * len(results)


@pytest.mark.slow
def test_moe_routes_first_under_cp_with_whole_experts(results):
    """cp 2 x ep 2 (experts whole per rank): every MoE layer routes its own tokens and moves them by
    the all-to-all, the shared experts running while the tokens are in flight; cp 2 x ep 1 keeps
    the gather before the router (its tokens are checked in test_cp_decode_matches_single_rank)."""
    for res in results:
        layers, overlapped = res[("v32", "cp2-ep2", True, 0)]["moe_a2a"]
        assert layers > 0 and overlapped >= layers * (1 + 3 + 1 + 3 + 1 + 4)  # one call per layer and step
        assert res[("v32", "cp2", True, 0)]["moe_a2a"] == (0, 0)
