"""Sampler: last-token logits [bs, vocab] -> next token ids (+ optional logprobs).

Pipeline per batch (float32 throughout):
  raw logits -> penalties / logit_bias / min-token masks / grammar bitmask -> greedy rows: argmax
  sampled rows: / temperature -> softmax -> top_k -> top_p -> min_p -> draw.

- An all-greedy batch without logit processing does a single argmax and nothing else.
- top_k and top_p share one descending candidate list: `torch.topk(max_k)` when every sampled
  row has a finite top_k, else the top 1024 when they provably hold every row's nucleus, else
  one full sort. top_p is measured on the distribution left after top_k (renormalised, as HF
  and vLLM do); min_p is relative to the most likely token.
- The draw is an inverse-CDF lookup on the filtered, unnormalised weights (one uniform number
  per row; much cheaper than `torch.multinomial` on CPU), which also renormalises.
- Greedy ties go to the lowest token id (`torch.argmax`).

Logprobs are `log_softmax` of the RAW logits (before penalties, biases and temperature), i.e.
the model's own distribution, like SGLang's `SGLANG_RETURN_ORIGINAL_LOGPROB=1`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang.srt.platforms.kernel_dispatch import host_argmax
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

TOP_P_CANDIDATES = 1024  # top_p first tries the 1024 most likely tokens before a full sort


@dataclass
class SampleOutput:
    next_token_ids: torch.Tensor  # [bs] int64
    next_token_logprobs: Optional[torch.Tensor] = None  # [bs] float32
    top_logprobs: Optional[list[list[tuple[float, int]]]] = None  # per row, descending
    # per row, (logprob, id) of each id its request asked for (token_ids_logprob; None: not asked)
    token_ids_logprobs: Optional[list[Optional[list[tuple[float, int]]]]] = None


class Sampler(torch.nn.Module):
    """Samples one token per row; owns the generator shared by unseeded requests."""

    def __init__(self, seed: Optional[int] = None) -> None:
        super().__init__()
        self._seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def shared_generator(self, device: torch.device) -> Optional[torch.Generator]:
        """The generator of unseeded rows on `device` (None: torch's default RNG)."""
        if self._seed is None:
            return None
        g = self._generators.get(device)
        if g is None:
            g = torch.Generator(device=device)
            g.manual_seed(self._seed)
            self._generators[device] = g
        return g

    def forward(
        self,
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        return_logprob: bool = False,
        top_logprobs_nums: Optional[list[int]] = None,
        token_ids_logprob: Optional[list[Optional[list[int]]]] = None,
        shared_uniforms: Optional[torch.Tensor] = None,
    ) -> SampleOutput:
        """`shared_uniforms` ([bs], optional): the uniform number of each unseeded sampled row, drawn
        by the caller instead of from the shared generator (a split CP decode samples a subset of
        the batch with the numbers one process draws for the whole batch: `sampler_cp.py`)."""
        bs = logits.shape[0]
        if bs != info.batch_size:
            raise ValueError(f"logits have {bs} rows but the batch info has {info.batch_size}")
        max_top = max(top_logprobs_nums) if top_logprobs_nums else 0
        logprobs_all = None
        wants_ids = bool(token_ids_logprob) and any(ids is not None for ids in token_ids_logprob)
        if bs > 0 and (return_logprob or max_top > 0 or wants_ids):
            logprobs_all = torch.log_softmax(logits.float(), dim=-1)

        if info.all_greedy and not info.needs_logit_processing:
            next_ids = greedy_argmax(logits.float())  # float32 argmax is faster on CPU
        else:
            x = logits.float()
            if info.needs_logit_processing:
                if x is logits:
                    x = x.clone()
                info.process_logits(x)
            next_ids = self._choose(x, info, shared_uniforms)
        next_ids = next_ids.to(torch.int64)

        out = SampleOutput(next_token_ids=next_ids)
        if return_logprob:
            if bs == 0:
                out.next_token_logprobs = torch.empty(0, dtype=torch.float32, device=logits.device)
            else:
                out.next_token_logprobs = logprobs_all.gather(1, next_ids.view(-1, 1)).view(-1)
        if top_logprobs_nums is not None:
            out.top_logprobs = _top_logprobs(logprobs_all, top_logprobs_nums, max_top)
        if wants_ids:
            out.token_ids_logprobs = [
                None if ids is None else list(zip(logprobs_all[row, ids].tolist(), ids))
                for row, ids in enumerate(token_ids_logprob)
            ]
        return out

    # ------------------------------------------------------------------ internals
    def _choose(
        self, x: torch.Tensor, info: SamplingBatchInfo, given: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Argmax for greedy rows, filtered sampling for the others ([bs] int64)."""
        if info.all_greedy:
            return greedy_argmax(x)
        greedy = info.greedy_rows
        if any(greedy):
            ids = greedy_argmax(x)
            rows = [i for i, g in enumerate(greedy) if not g]
            sel = torch.tensor(rows, dtype=torch.int64, device=x.device)
            ids[sel] = self._sample(x[sel], info, rows, given)
            return ids
        return self._sample(x, info, list(range(x.shape[0])), given)

    def _sample(
        self, x: torch.Tensor, info: SamplingBatchInfo, rows: list[int], given: Optional[torch.Tensor]
    ) -> torch.Tensor:
        """Sample the given rows of the batch; `x` holds exactly those rows."""
        dev = x.device
        row_t = None if len(rows) == info.batch_size else torch.tensor(rows, device=info.device)

        def pick(t: torch.Tensor) -> torch.Tensor:
            return (t if row_t is None else t[row_t]).to(dev)

        probs = torch.softmax(x / pick(info.temperatures), dim=-1)
        min_ps = pick(info.min_ps)
        if info.need_top_k or info.need_top_p:
            vals, idx = _filter_sorted(probs, pick(info.top_ks), pick(info.top_ps), min_ps, info)
            choice = self._draw(vals, info, rows, given)
            return idx.gather(1, choice.view(-1, 1)).view(-1)
        if info.need_min_p:
            peak = probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < min_ps.view(-1, 1) * peak, 0.0)
        return self._draw(probs, info, rows, given)

    def _draw(
        self, weights: torch.Tensor, info: SamplingBatchInfo, rows: list[int], given: Optional[torch.Tensor]
    ) -> torch.Tensor:
        """One categorical draw per row from non-negative `weights` (inverse CDF).

        Seeded rows take their uniform number from their own generator, the others from the
        shared one (or from `given`, indexed by batch row). A zero weight is never chosen.
        """
        dev = weights.device
        shared = self.shared_generator(dev)
        seeds = [info.row_seeds[r] for r in rows]
        if given is not None:
            given = given.to(dev)
        if all(s is None for s in seeds):
            u = self._shared_uniforms(rows, shared, given, dev)
        else:
            u = torch.empty(len(rows), 1, device=dev)
            unseeded = [j for j, s in enumerate(seeds) if s is None]
            if unseeded:
                sel = torch.tensor(unseeded, dtype=torch.int64, device=dev)
                u[sel] = self._shared_uniforms([rows[j] for j in unseeded], shared, given, dev)
            for j, s in enumerate(seeds):
                if s is not None:
                    g = torch.Generator(device=dev)
                    g.manual_seed(s)
                    u[j] = torch.rand(1, generator=g, device=dev)
        cum = weights.cumsum(dim=-1)
        total = cum[:, -1:]
        idx = torch.searchsorted(cum, u * total, right=True)
        last_positive = (cum < total).sum(dim=-1, keepdim=True)  # guards u * total == total
        return torch.minimum(idx, last_positive).view(-1)

    @staticmethod
    def _shared_uniforms(rows: list[int], shared, given: Optional[torch.Tensor], dev) -> torch.Tensor:
        """[len(rows), 1]: the next numbers of the shared generator, or `given`'s for these rows."""
        if given is None:
            return torch.rand(len(rows), 1, generator=shared, device=dev)
        return given[torch.tensor(rows, dtype=torch.int64, device=dev)].view(-1, 1)


def greedy_argmax(x: torch.Tensor) -> torch.Tensor:
    """`torch.argmax(x, dim=-1)` ([bs] int64): same ties (lowest id) and NaN rule (first NaN wins).

    A 2-D float32 CPU tensor takes numpy's argmax: single-threaded SIMD, faster than torch's
    parallel reduction at these sizes and immune to OpenMP barrier stalls when the cores are shared
    (numbers: docs/benchmarks.md).
    """
    if host_argmax(x):
        return torch.from_numpy(x.detach().numpy().argmax(axis=-1).astype("int64", copy=False))
    return torch.argmax(x, dim=-1)


def _filter_sorted(
    probs: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    info: SamplingBatchInfo,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Descending candidate probabilities (filtered ones zeroed) and their token ids.

    Candidates are `topk(max top_k)` when every row has a top_k; for top_p, the first
    `TOP_P_CANDIDATES` tokens when every row's nucleus provably ends inside them (exact, and much
    cheaper than a full sort on CPU); else a full sort.
    """
    vocab = probs.shape[1]
    top_ks = top_ks.clamp(max=vocab)
    vals = idx = None
    if info.all_top_k_limited:
        vals, idx = torch.topk(probs, int(top_ks.max()), dim=-1, sorted=True)
    elif info.need_top_p and TOP_P_CANDIDATES < vocab:
        vals, idx = torch.topk(probs, TOP_P_CANDIDATES, dim=-1, sorted=True)
        unlimited = top_ks >= vocab
        inside = (top_ks <= TOP_P_CANDIDATES) | (unlimited & (vals.sum(dim=-1) > top_ps * probs.sum(dim=-1)))
        if not bool(inside.all()):
            vals = idx = None
    if vals is None:
        vals, idx = torch.sort(probs, dim=-1, descending=True)
    width = vals.shape[1]
    if info.need_top_k:
        pos = torch.arange(width, device=probs.device).view(1, -1)
        vals = vals.masked_fill(pos >= top_ks.view(-1, 1), 0.0)
    if info.need_top_p:
        # Mass left by top_k (top_p is measured on the renormalised top_k distribution).
        kept = torch.where(top_ks <= width, vals.sum(dim=-1), probs.sum(dim=-1))
        cum = vals.cumsum(dim=-1)
        vals = vals.masked_fill((cum - vals) > (top_ps * kept).view(-1, 1), 0.0)
    if info.need_min_p:
        vals = vals.masked_fill(vals < min_ps.view(-1, 1) * vals[:, :1], 0.0)
    return vals, idx


def _top_logprobs(
    logprobs_all: Optional[torch.Tensor], nums: list[int], max_top: int
) -> list[list[tuple[float, int]]]:
    """Per row, the `nums[i]` most likely (logprob, token_id) pairs, descending."""
    if max_top <= 0 or logprobs_all is None:
        return [[] for _ in nums]
    k = min(max_top, logprobs_all.shape[1])
    vals, ids = torch.topk(logprobs_all, k, dim=-1, sorted=True)
    vals_l, ids_l = vals.tolist(), ids.tolist()
    return [list(zip(vals_l[i][:n], ids_l[i][:n])) for i, n in enumerate(nums)]
