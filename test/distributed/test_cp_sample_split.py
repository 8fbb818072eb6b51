"""Sampling under a split CP decode (`layers/sampler_cp.py`): each cp rank samples only the rows whose
logits it computed and the ranks all-gather the results (ids, plus logprob columns only when asked),
never the vocab-wide logit rows.

On 2 gloo ranks, against the single-process `Sampler` on the whole batch's logits, three steps in a
row with the same samplers: a batch of split decodes, a split prompt, two prompts below
`min_split_tokens` (every rank holds their logits; dealt round-robin for sampling) and one
request that samples nothing this step. Rows mix greedy, per-request seeds, unseeded rows (the
sampler's shared generator, `--random-seed`), top-k / top-p / min-p, frequency / presence /
repetition penalties, logit_bias, min-token EOS masks and grammar bitmasks, with logprobs, top
logprobs and token_ids_logprob: ids and every logprob identical to one process; also a step where
one rank's rows are plain temperature sampling while the other rank holds a top-k row (the batch's
sampling path, sorted probabilities, applies to every rank's rows, as in one process). The all-gather
carries 1 + 1 + 2·top-k + len(token ids) float64 columns per row (1 for a greedy batch asking
for no logprobs), far below the vocabulary.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.distributed.parallel_layout import ParallelLayout
from sglang.srt.distributed.parallel_state import ParallelGroups
from sglang.srt.layers import sampler_cp
from sglang.srt.layers.context_parallel import CPLayout
from sglang.srt.layers.logits_processor import CPLocalLogits
from sglang.srt.layers.sampler import Sampler
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

VOCAB = 300  # not a multiple of 32: the bitmask's last word is partial
EOS = [2]
# requests: (new tokens, cached prefix); min split 8: requests 2 and 7 run whole on every rank
EXT = [1, 1, 5, 1, 14, 1, 1, 3, 1]
PRE = [6, 4, 0, 8, 0, 3, 9, 0, 5]
MIN_SPLIT = 8
SAMPLE_ROWS = [0, 1, 2, 3, 5, 6, 7, 8]  # request 4 is a chunk that samples nothing this step
PARAMS = [
    dict(temperature=0),
    dict(temperature=0.7, seed=11),
    dict(temperature=1.0, top_p=0.9),  # unseeded: the shared generator
    dict(temperature=0.8, top_k=5, seed=5, frequency_penalty=0.5, presence_penalty=0.3),
    dict(temperature=1.2, min_p=0.05, repetition_penalty=1.3),  # unseeded
    dict(temperature=0, logit_bias={"7": 5.0, "9": -3.0}),
    dict(temperature=0.9, top_k=40, top_p=0.8),  # unseeded, a prompt below the split threshold
    dict(temperature=0.6, seed=3, min_new_tokens=4, stop_token_ids=[4]),
]
# rank 1 samples rows 1, 4, 6 and 7 (decodes 1, 3, 5 and the second unsplit prompt): all plain
# temperature here, while rank 0's row 3 has a top-k, so the batch draws from sorted probabilities
# and rank 1 must too
PLAIN_ON_RANK1 = [
    dict(temperature=0),
    dict(temperature=0.9, seed=21),
    dict(temperature=1.0),
    dict(temperature=0.8, top_k=7),
    dict(temperature=1.3),
    dict(temperature=0.5, seed=4),
    dict(temperature=1.0, seed=6),
    dict(temperature=0.7),
]
KINDS = ("full", "full", "greedy", "plain-on-rank1", "full")
CONSTRAINED = (0, 3, 6)  # sampled rows with a grammar bitmask
TOP_NUMS = [0, 3, 5, 0, 2, 1, 0, 4]
TOKEN_IDS = [None, [1, 5, 299], None, None, [0], None, [2, 3], None]


def _params(table: list[dict]) -> list[SamplingParams]:
    out = []
    for kw in table:
        p = SamplingParams(max_new_tokens=16, **kw)
        p.normalize()
        out.append(p)
    return out


def _batch(step: int, kind: str) -> SimpleNamespace:
    gen = torch.Generator().manual_seed(100 + step)
    logprobs = kind != "greedy"
    table = PLAIN_ON_RANK1 if kind == "plain-on-rank1" else PARAMS if logprobs else [{"temperature": 0}] * 8
    n = len(SAMPLE_ROWS)
    mask = torch.full((n, (VOCAB + 31) // 32), -1, dtype=torch.int32)
    for j in CONSTRAINED:
        mask[j] = torch.randint(-(2**31), 2**31 - 1, (mask.shape[1],), generator=gen, dtype=torch.int32)
    return SimpleNamespace(
        sample_rows=list(SAMPLE_ROWS),
        sampling_params=_params(table),
        prompt_ids=[torch.randint(0, VOCAB, (5,), generator=gen).tolist() for _ in range(n)],
        output_ids=[torch.randint(0, VOCAB, (step + j % 3,), generator=gen).tolist() for j in range(n)],
        return_logprob=logprobs,
        top_logprobs_nums=list(TOP_NUMS) if logprobs else [0] * n,
        token_ids_logprob=list(TOKEN_IDS) if logprobs else [None] * n,
        vocab_mask=mask if logprobs else None,
    )


def _reference(sampler: Sampler, logits: torch.Tensor, wb) -> dict:
    info = SamplingBatchInfo.from_params(
        wb.sampling_params, wb.output_ids, wb.prompt_ids, VOCAB, eos_token_ids=EOS, vocab_mask=wb.vocab_mask
    )
    rows = logits[torch.tensor(wb.sample_rows)]
    out = sampler(rows, info, wb.return_logprob, wb.top_logprobs_nums, wb.token_ids_logprob)
    return _as_dict(out)


def _as_dict(out) -> dict:
    return {
        "ids": out.next_token_ids.tolist(),
        "logprobs": None if out.next_token_logprobs is None else out.next_token_logprobs.tolist(),
        "top": out.top_logprobs,
        "token_ids": out.token_ids_logprobs,
    }


def _local_logits(layout: CPLayout, logits: torch.Tensor) -> torch.Tensor:
    """This rank's rows as the LM head computes them: its split last tokens, then the replicated."""
    last = layout.last_token_idx()
    mine = [i for i in range(layout.batch_size) if int(layout.holder_rank[last[i]]) == layout.cp_rank]
    reqs, _ = layout.replicated_last_tokens()
    return logits[torch.tensor(mine + reqs.tolist(), dtype=torch.int64)]


def _body(rank: int, world_size: int) -> dict:
    groups = ParallelGroups.build(ParallelLayout(tp=2, attn_cp=2), rank)
    widths: list[tuple[int, torch.dtype]] = []
    real_gather = sampler_cp.start_gather

    def spy(group, rows, sizes):
        widths.append((rows.shape[1], rows.dtype))
        return real_gather(group, rows, sizes)

    sampler_cp.start_gather = spy
    ref_sampler, cp_sampler = Sampler(seed=1234), Sampler(seed=1234)
    steps = []
    for step, kind in enumerate(KINDS):
        layout = CPLayout.build(
            EXT,
            PRE,
            2,
            groups.attn_cp.rank,
            group=groups.attn_cp,
            split_decodes=True,
            min_split_tokens=MIN_SPLIT,
        )
        logits = torch.randn(len(EXT), VOCAB, generator=torch.Generator().manual_seed(step)) * 3
        wb = _batch(step, kind)
        ref = _reference(ref_sampler, logits, wb)
        local = _local_logits(layout, logits)
        got = _as_dict(sampler_cp.cp_sample(cp_sampler, CPLocalLogits(local, layout), wb, EOS))
        steps.append({"ref": ref, "got": got, "local_rows": local.shape[0]})
    return {"steps": steps, "widths": widths}


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_body, 2, timeout=120)


@pytest.mark.slow  # spawns gloo ranks
def test_cp_sampling_matches_one_process(results):
    for rank, res in enumerate(results):
        for i, s in enumerate(res["steps"]):
            assert s["got"] == s["ref"], (rank, i)
    ids = [s["ref"]["ids"] for s in results[0]["steps"]]
    assert len({tuple(x) for x in ids}) > 1  # the steps differ: the generators moved on
    sampled = [j for j, kw in enumerate(PARAMS) if kw["temperature"] > 0]
    assert any(len({x[j] for x in ids}) > 1 for j in sampled)  # not a degenerate (greedy) draw
    plain = results[1]["steps"][KINDS.index("plain-on-rank1")]
    assert plain["got"] == plain["ref"]


@pytest.mark.slow
def test_each_rank_samples_its_own_rows_and_gathers_ids(results):
    """Each rank computed only its rows' logits (split last tokens + the two unsplit prompts), and
    the all-gather carried a few float64 columns per row, not the vocabulary."""
    held = [res["steps"][0]["local_rows"] for res in results]
    split_last = sum(1 for n, p in zip(EXT, PRE) if n == 1 or n >= MIN_SPLIT)
    assert sum(held) == split_last + 2 * 2 and max(held) < len(EXT)
    for res in results:
        cols = 1 + 1 + 2 * max(TOP_NUMS) + max(len(t) for t in TOKEN_IDS if t)
        assert res["widths"] == [(1 if k == "greedy" else cols, torch.float64) for k in KINDS]
        assert cols < VOCAB // 10
