"""Sampling under a split CP decode: each cp rank samples the rows whose logits it computed.

With split decodes (`communicator.cp_logits_split`) every cp rank runs the LM head on the last
tokens it holds only: its split last tokens, then the last tokens every rank holds (unsplit
prefills). Instead of all-gathering those vocab-wide logit rows so that every rank can sample the
whole batch, each sampled row is owned by one rank (`CPSamplePlan`: a split row by its holder,
the replicated rows dealt round-robin), the owner samples it, and one all-gather moves the
results: per row the token id and, only when the batch asked for them, its logprob, its top
logprobs and its `token_ids_logprob` values (ids of the latter are known everywhere). For a batch
of B sampled rows that is B · (1 + logprob columns) float64 values instead of B · vocab float32.

Sampling stays identical to one process: the per-row inputs (penalties, logit_bias, min-token
masks, the grammar bitmask, per-request seeds) are the owner's subset of the batch's, every
per-row step of the sampler is row-independent, and the uniform numbers of unseeded sampled rows
come from the sampler's shared generator drawn for the whole batch, on every rank, exactly as a
single process draws them (`shared_uniforms`), so each owner uses the number cp 1 would have.

Batches that need every rank's logits never get here: all-token logits (prompt logprobs,
`return_all_logits`) and DP attention take the gather path of `LogitsProcessor`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence

import torch

from sglang.srt.layers.cp_exchange import start_gather
from sglang.srt.layers.sampler import SampleOutput, Sampler
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

if TYPE_CHECKING:
    from sglang.srt.layers.context_parallel import CPLayout
    from sglang.srt.layers.logits_processor import CPLocalLogits
    from sglang.srt.sampling.sampling_params import SamplingParams


class SampleRows(Protocol):
    """What the CP sampler reads of a `ModelWorkerBatch` (per sampled row j, row sample_rows[j])."""

    sample_rows: list[int]
    sampling_params: list["SamplingParams"]
    prompt_ids: list[list[int]]
    output_ids: list[list[int]]
    return_logprob: bool
    top_logprobs_nums: list[int]
    token_ids_logprob: list[Optional[list[int]]]
    vocab_mask: Optional[Any]


@dataclass(frozen=True)
class CPSamplePlan:
    """Which cp rank samples each sampled row (identical on every rank: a pure function of the
    layout and `sample_rows`)."""

    local_row: list[int]  # per sampled row j: its row in this rank's logits (-1: not held here)
    mine: list[int]  # sampled rows j this rank samples, ascending
    order: list[int]  # sampled rows j in all-gather order (rank 0's, then rank 1's, ...)
    sizes: list[int]  # per rank, how many rows it samples

    @staticmethod
    def build(cp: "CPLayout", sample_rows: Sequence[int]) -> "CPSamplePlan":
        spec = cp.last_tokens_spec()
        last = cp.last_token_idx()
        owner = [-1] * cp.batch_size
        local_row = [-1] * cp.batch_size
        holders = cp.holder_rank[last].tolist()
        mine_split = 0
        for req, h in enumerate(holders):  # split last tokens: this rank's rows in request order
            if h >= 0:
                owner[req] = h
                if h == cp.cp_rank:
                    local_row[req], mine_split = mine_split, mine_split + 1
        assert mine_split == int(spec.local_rows.numel())
        reqs, _ = cp.replicated_last_tokens()
        for j, req in enumerate(reqs.tolist()):  # every rank holds them: dealt round-robin
            owner[req], local_row[req] = j % cp.cp_size, mine_split + j
        per_rank: list[list[int]] = [[] for _ in range(cp.cp_size)]
        for j, req in enumerate(sample_rows):
            per_rank[owner[req]].append(j)
        return CPSamplePlan(
            local_row=[local_row[req] for req in sample_rows],
            mine=per_rank[cp.cp_rank],
            order=[j for rows in per_rank for j in rows],
            sizes=[len(rows) for rows in per_rank],
        )


def shared_uniforms(sampler: Sampler, params: Sequence["SamplingParams"], device) -> Optional[torch.Tensor]:
    """[len(params)] float32: the shared generator's uniform number of each unseeded sampled row,
    drawn as one process draws them (one `rand` of the batch's unseeded non-greedy rows, in row
    order; other entries 0). None when no row draws from the shared generator."""
    rows = [j for j, p in enumerate(params) if not p.is_greedy and p.seed is None]
    if not rows:
        return None
    drawn = torch.rand(len(rows), 1, generator=sampler.shared_generator(device), device=device)
    out = torch.zeros(len(params), dtype=torch.float32, device=device)
    out[torch.tensor(rows, dtype=torch.int64, device=device)] = drawn.view(-1)
    return out


def cp_sample(
    sampler: Sampler, local: "CPLocalLogits", wb: SampleRows, eos_token_ids: Optional[Sequence[int]] = None
) -> SampleOutput:
    """Sample `wb.sample_rows` under a split CP decode; every rank returns every sampled row's
    result, in `sample_rows` order (an all-gather over the cp group)."""
    cp, logits = local.layout, local.logits
    plan = CPSamplePlan.build(cp, wb.sample_rows)
    dev = logits.device
    uniforms = shared_uniforms(sampler, wb.sampling_params, dev)  # on every rank (cp 1's draws)
    mine = plan.mine
    n = len(wb.sample_rows)
    nums = wb.top_logprobs_nums
    wants_ids = bool(wb.token_ids_logprob) and any(ids is not None for ids in wb.token_ids_logprob)
    top_k = min(max(nums, default=0), logits.shape[1])
    ids_width = max((len(ids) for ids in wb.token_ids_logprob if ids is not None), default=0)
    width = 1 + int(wb.return_logprob) + 2 * top_k + ids_width
    packed = torch.zeros(len(mine), width, dtype=torch.float64, device=dev)
    if mine:
        out = sampler(
            logits.index_select(0, torch.tensor([plan.local_row[j] for j in mine], device=dev)),
            _subset_info(wb, mine, logits, eos_token_ids),
            return_logprob=wb.return_logprob,
            top_logprobs_nums=[nums[j] for j in mine] if nums else None,
            token_ids_logprob=[wb.token_ids_logprob[j] for j in mine] if wb.token_ids_logprob else None,
            shared_uniforms=None if uniforms is None else uniforms[torch.tensor(mine, device=dev)],
        )
        _pack(packed, out, top_k)
    gathered = start_gather(cp.group, packed, plan.sizes).wait()
    rows = torch.empty_like(gathered)
    rows[torch.tensor(plan.order, dtype=torch.int64, device=dev)] = gathered
    return _unpack(rows, n, wb, top_k, wants_ids)


# Flags of the whole batch that pick the sampler's path for every row: with top-k / top-p anywhere
# in the batch a row draws from its probabilities sorted in descending order, else in vocabulary
# order, so one process's token for a row depends on its batch partners. The owner samples its
# rows down the batch's path. (Left to each rank: whether top-p tries the 1024 most likely tokens
# before a full sort, which changes only the summation order of the kept mass.)
_BATCH_FLAGS = ("need_top_k", "need_top_p", "need_min_p", "all_top_k_limited")


def _subset_info(wb: SampleRows, mine: list[int], logits: torch.Tensor, eos_token_ids) -> SamplingBatchInfo:
    """The sampling inputs of this rank's rows (penalties, logit_bias, min-token masks, grammar
    bitmask, seeds), on the whole batch's sampling path (`_BATCH_FLAGS`)."""
    mask = wb.vocab_mask
    if mask is not None:
        mask = mask[torch.tensor(mine, dtype=torch.int64, device=mask.device)]
    vocab, dev = logits.shape[-1], logits.device
    sub = SamplingBatchInfo.from_params(
        [wb.sampling_params[j] for j in mine],
        [wb.output_ids[j] for j in mine],
        [wb.prompt_ids[j] for j in mine],
        vocab_size=vocab,
        device=dev,
        eos_token_ids=eos_token_ids,
        vocab_mask=mask,
    )
    if sub.all_greedy or len(mine) == len(wb.sample_rows):
        return sub  # greedy rows take the argmax on any path
    whole = SamplingBatchInfo.from_params(wb.sampling_params, wb.output_ids, wb.prompt_ids, vocab, dev)
    return dataclasses.replace(sub, **{name: getattr(whole, name) for name in _BATCH_FLAGS})


def _pack(packed: torch.Tensor, out: SampleOutput, top_k: int) -> None:
    """Columns: id, [logprob], [top_k values, top_k ids], [token_ids_logprob values]."""
    packed[:, 0] = out.next_token_ids.to(torch.float64)
    col = 1
    if out.next_token_logprobs is not None:
        packed[:, 1] = out.next_token_logprobs.to(torch.float64)
        col = 2
    for i, pairs in enumerate(out.top_logprobs or []):
        for k, (val, tok) in enumerate(pairs):
            packed[i, col + k], packed[i, col + top_k + k] = val, tok
    col += 2 * top_k
    for i, pairs in enumerate(out.token_ids_logprobs or []):
        for k, (val, _) in enumerate(pairs or []):
            packed[i, col + k] = val


def _unpack(rows: torch.Tensor, n: int, wb: SampleRows, top_k: int, wants_ids: bool) -> SampleOutput:
    res = SampleOutput(next_token_ids=rows[:, 0].to(torch.int64))
    col = 1
    if wb.return_logprob:
        res.next_token_logprobs = rows[:, 1].to(torch.float32)
        col = 2
    table = rows.tolist()
    nums = wb.top_logprobs_nums or []  # none given: an empty list, as one process returns
    res.top_logprobs = [
        [(table[j][col + k], int(table[j][col + top_k + k])) for k in range(min(nums[j], top_k))]
        for j in range(len(nums))
    ]
    col += 2 * top_k
    if wants_ids:
        res.token_ids_logprobs = [
            None if ids is None else [(table[j][col + k], t) for k, t in enumerate(ids)]
            for j, ids in enumerate(wb.token_ids_logprob)
        ]
    return res
